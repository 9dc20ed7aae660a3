package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// traffic counts a client's unary requests and the bytes it sends and
// receives (unary and streams: watch notifications, keepalives).
type traffic struct {
	requests atomic.Int64
	serial   atomic.Int64 // Txns whose every op is a serializable range
	in, out  atomic.Int64
	watchOut atomic.Int64 // messages sent on watch streams
}

type methodKey struct{}

func (tr *traffic) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, methodKey{}, info.FullMethodName)
}
func (tr *traffic) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (tr *traffic) HandleConn(context.Context, stats.ConnStats) {}
func (tr *traffic) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch p := s.(type) {
	case *stats.InPayload:
		tr.in.Add(int64(p.WireLength))
	case *stats.OutPayload:
		tr.out.Add(int64(p.WireLength))
		if m, _ := ctx.Value(methodKey{}).(string); m == "/etcdserverpb.Watch/Watch" {
			tr.watchOut.Add(1)
		}
	}
}

// client returns a client of c whose traffic tr counts.
func (tr *traffic) client(t *testing.T, c *etcdtest.Cluster) *clientv3.Client {
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		tr.requests.Add(1)
		if txn, ok := req.(*pb.TxnRequest); ok && serializable(txn) {
			tr.serial.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	return c.Client(t, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(count), grpc.WithStatsHandler(tr))
	})
}

// serializable reports whether every op of txn is a serializable range.
func serializable(txn *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{txn.Success, txn.Failure} {
		for _, op := range ops {
			if r := op.GetRequestRange(); r == nil || !r.Serializable {
				return false
			}
		}
	}
	return len(txn.Success) > 0
}

// lockRPCsPerAcquisition runs n contenders of one Mutex (one session each,
// all on one client whose traffic is counted) through rounds acquisitions
// each, holding 1 ms, and returns the unary requests per acquisition
// (join, re-read, release, and anything else Lock and Unlock send). It
// logs the bytes received per acquisition too (no assertion on it).
func lockRPCsPerAcquisition(t *testing.T, c *etcdtest.Cluster, n, rounds int) float64 {
	t.Helper()
	var tr traffic
	cli := tr.client(t, c)
	name := fmt.Sprintf("lock/rpcs-%d", n)
	ms := make([]*etcd.Mutex, n)
	for i := range ms {
		s, err := etcd.NewSession(context.Background(), cli, etcd.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		ms[i] = newMutex(t, s, name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start, in0 := tr.requests.Load(), tr.in.Load()
	began := time.Now()
	most := contend(t, ctx, ms, rounds)
	if most > 1 {
		t.Fatalf("%d holders at once", most)
	}
	acqs := float64(n * rounds)
	per := float64(tr.requests.Load()-start) / acqs
	t.Logf("%3d contenders: %d acquisitions in %v, %.3f unary RPCs and %.0f bytes received per acquisition",
		n, n*rounds, time.Since(began).Round(time.Millisecond), per, float64(tr.in.Load()-in0)/acqs)
	return per
}

// Unary RPCs per acquisition of a Mutex stay flat (within 10%) from 2 to
// 64 contenders (to 512 in TestLockRPCsFlat512, without -race).
func TestLockRPCsFlat(t *testing.T) {
	c := etcdtest.Etcd(t)
	figures := map[int]float64{}
	for _, n := range []int{2, 16, 64} {
		figures[n] = lockRPCsPerAcquisition(t, c, n, max(2, 64/n))
	}
	flat(t, figures)
}

// A handoff costs the holder's release and one linearizable read: the
// waiter next in line sends exactly one request between the holder's Unlock
// and its own grant, its own-key and predecessor check, and that Txn is
// linearizable. A serializable one would be faster (no round of raft behind
// the next write) but could answer from a member that lags or is cut off,
// granting the lock after another client was granted it (docs/DESIGN.md,
// "Why the wake-up read is linearizable"). The holder's Unlock is one request.
func TestHandoffOneLinearizableRead(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	var ta, tb traffic
	sa, err := etcd.NewSession(ctx, ta.client(t, c), etcd.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sa.Close() })
	sb, err := etcd.NewSession(ctx, tb.client(t, c), etcd.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close() })
	a, b := newMutex(t, sa, "handoff-rpcs"), newMutex(t, sb, "handoff-rpcs")
	cli := c.Client(t)
	for round := range 6 {
		// Alternate who holds, so that both the first wait of a Mutex (its
		// last join found the lock free) and a later one are covered.
		holder, waiter, th, tw := a, b, &ta, &tb
		if round%2 == 1 {
			holder, waiter, th, tw = b, a, &tb, &ta
		}
		g, err := holder.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			g   *etcd.Grant
			err error
		}
		got := make(chan result, 1)
		go func() {
			g, err := waiter.Lock(ctx)
			got <- result{g, err}
		}()
		waitQueued(t, cli, "handoff-rpcs", 2)
		time.Sleep(100 * time.Millisecond) // the waiter's watch is confirmed
		before, hbefore, sbefore := tw.requests.Load(), th.requests.Load(), tw.serial.Load()
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if d := th.requests.Load() - hbefore; d != 1 {
			t.Errorf("round %d: the holder's Unlock sent %d requests, want 1", round, d)
		}
		var r result
		select {
		case r = <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("the waiter was not granted the lock")
		}
		if r.err != nil {
			t.Fatal(r.err)
		}
		if d, ds := tw.requests.Load()-before, tw.serial.Load()-sbefore; d != 1 || ds != 0 {
			t.Errorf("round %d: the waiter sent %d requests (%d serializable Txns) between the holder's Unlock and its grant, want 1 (0)", round, d, ds)
		}
		if err := r.g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A waiter counts only the deletions of keys created before its own: a
// waiter behind it that gives up (its key deleted from the middle of the
// queue) never lets it in beside the holder.
func TestLockCountsOnlyKeysAhead(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	const name = "lock-count"
	h, err := newMutex(t, newSession(t, c, etcd.WithTTL(10*time.Second)), name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var g1 *etcd.Grant
	go func() {
		var err error
		g1, err = newMutex(t, newSession(t, c, etcd.WithTTL(10*time.Second)), name).Lock(ctx)
		got <- err
	}()
	waitQueued(t, cli, name, 2)
	// Three waiters behind it give up one after the other.
	for i := range 3 {
		wctx, cancel := context.WithCancel(ctx)
		gave := make(chan error, 1)
		go func() {
			_, err := newMutex(t, newSession(t, c, etcd.WithTTL(10*time.Second)), name).Lock(wctx)
			gave <- err
		}()
		waitQueued(t, cli, name, 3)
		cancel()
		if err := <-gave; !errors.Is(err, context.Canceled) {
			t.Fatalf("waiter %d behind: %v, want context.Canceled", i, err)
		}
		waitFor(t, 5*time.Second, "the waiter behind left", func() bool { return len(keys(t, cli, name+"/")) == 2 })
	}
	select {
	case err := <-got:
		t.Fatalf("the first waiter returned (%v) while the holder holds", err)
	case <-time.After(250 * time.Millisecond):
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		if err := g1.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first waiter was not granted the lock after the holder left")
	}
}

// Uncontended, Lock and Unlock are two requests and nothing on a watch
// stream (but the session's own watch of a grant held past 20 ms, which is
// told apart by its count of creations: one create and one cancel each).
func TestUncontendedNoWatch(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	var tr traffic
	s, err := etcd.NewSession(ctx, tr.client(t, c), etcd.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	m := newMutex(t, s, "uncontended")
	cycle := func() {
		g, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cycle()
	time.Sleep(200 * time.Millisecond)
	const rounds = 10
	created, _ := watchCreates(s)
	msgs, reqs := tr.watchOut.Load(), tr.requests.Load()
	for range rounds {
		cycle()
	}
	time.Sleep(200 * time.Millisecond) // whatever was queued on a stream is sent
	created2, _ := watchCreates(s)
	if d := tr.requests.Load() - reqs; d != 2*rounds {
		t.Errorf("%d uncontended Lock+Unlock sent %d requests, want %d", rounds, d, 2*rounds)
	}
	if d := tr.watchOut.Load() - msgs - 2*(created2-created); d != 0 {
		t.Errorf("%d uncontended Lock+Unlock sent %d watch messages besides the session's grant watches, want 0", rounds, d)
	}
}

// grantLocker is what contend drives: an etcd Mutex or Semaphore.
type grantLocker interface {
	Lock(ctx context.Context) (*etcd.Grant, error)
}

// contend has every locker take its lock and release it rounds times,
// holding 1 ms each time, and returns the most holders seen at once.
func contend[L grantLocker](t *testing.T, ctx context.Context, lockers []L, rounds int) int64 {
	t.Helper()
	var inside, most atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(lockers))
	for _, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				g, err := l.Lock(ctx)
				if err != nil {
					errs <- err
					return
				}
				k := inside.Add(1)
				for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				if err := g.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return most.Load()
}
