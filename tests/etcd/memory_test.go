//go:build !race

// The race detector inflates allocations, so this file is left out of
// -race builds; `make test` runs it in a separate build without -race.

package etcd_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// inUse is the heap plus goroutine stacks in use after a full collection,
// and the number of goroutines.
func inUse() (bytes int64, goroutines int) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc + ms.StackInuse), runtime.NumGoroutine()
}

// Defect 8: 10,000 grants held through one session cost at most 2 KiB each
// (heap plus stacks) and no goroutine, on the client side.
//
// The etcd server runs in this process, so its own cost per lock (the key,
// the raft entry, the server-side watcher) is measured first by doing the
// same requests without holdfast (the acquiring Txn and a watch of the key
// on a raw stream), and subtracted.
func TestMemoryPerGrant(t *testing.T) {
	n := 10_000
	if testing.Short() {
		n = 1_000
	}
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	cli := c.Client(t)
	s := newSession(t, c, etcd.WithTTL(60*time.Second))
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	st, err := pb.NewWatchClient(cli.ActiveConnection()).Watch(clientv3.WithRequireLeader(ctx))
	if err != nil {
		t.Fatal(err)
	}

	heap0, gr0 := inUse()
	created := make(chan error, 1)
	go func() { // receive while sending, or flow control stops both sides
		for c := 0; c < n; {
			resp, err := st.Recv()
			if err != nil {
				created <- err
				return
			}
			if resp.Created {
				c++
			}
		}
		created <- nil
	}()
	for i := range n {
		pfx := fmt.Sprintf("mem-base/%d/", i)
		key := fmt.Sprintf("%s%x", pfx, int64(lease.ID))
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(
			clientv3.OpGet(pfx, clientv3.WithLastCreate()...), clientv3.OpGet(pfx, clientv3.WithFirstCreate()...),
			clientv3.OpPut(key, "", clientv3.WithLease(lease.ID))).Commit()
		if err != nil {
			t.Fatal(err)
		}
		err = st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
			Key: []byte(key), StartRevision: resp.Header.Revision + 1, WatchId: int64(i + 1),
			Filters: []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT}}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	heap1, gr1 := inUse()

	grants := make([]*etcd.Grant, 0, n)
	for i := range n {
		g, err := newMutex(t, s, fmt.Sprintf("mem/%d", i)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, g)
	}
	waitFor(t, 30*time.Second, "every grant's watch confirmed", func() bool {
		_, confirmed := watchCreates(s)
		return confirmed >= int64(n)
	})
	heap2, gr2 := inUse()

	server := float64(heap1-heap0) / float64(n)
	total := float64(heap2-heap1) / float64(n)
	perGrant := total - server
	perGoroutine := float64(gr2-gr1) / float64(n)
	t.Logf("%d grants through one session: %.0f B per grant on the client side (%.0f B with holdfast, minus %.0f B of server-side cost per lock), %.4f goroutines per grant (%d -> %d -> %d goroutines)",
		n, perGrant, total, server, perGoroutine, gr0, gr1, gr2)
	if perGrant > 2048 {
		t.Errorf("%.0f B per grant, want at most 2 KiB", perGrant)
	}
	if gr2-gr1 > 10 {
		t.Errorf("%d more goroutines for %d grants, want none per grant", gr2-gr1, n)
	}
	for _, g := range grants {
		if g.Context().Err() != nil {
			t.Fatalf("grant %s lost: %v", g.Key(), context.Cause(g.Context()))
		}
	}
	runtime.KeepAlive(grants)
}
