package etcdtest

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestFaults injects each mode into a Put of one key and checks what the
// caller got and what the store holds; the Nth rule skips the first match;
// a refused LeaseKeepAlive stream fails the keepalive.
func TestFaults(t *testing.T) {
	c := Etcd(t)
	f := NewFaults()
	cli := c.Client(t, f.Install)
	admin := c.Client(t)
	onKey := func(key string) func(string, any) bool {
		return func(_ string, req any) bool {
			r, ok := req.(*pb.PutRequest)
			return ok && string(r.Key) == key
		}
	}
	var puts int
	f.Observe(func(method string, _ any) {
		if method == "/etcdserverpb.KV/Put" {
			puts++
		}
	})
	exists := func(key string) bool {
		resp, err := admin.Get(ctxT(t, 5*time.Second), key)
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Kvs) == 1
	}
	for _, tc := range []struct {
		mode    FaultMode
		key     string
		applied bool
	}{{Refuse, "refused", false}, {LoseAnswer, "lost", true}} {
		hit := f.Inject(Rule{Method: "/etcdserverpb.KV/Put", Match: onKey(tc.key), Mode: tc.mode})
		_, err := cli.Put(ctxT(t, 5*time.Second), tc.key, "v")
		if status.Code(err) != codes.Unavailable || !hit() {
			t.Errorf("%v: Put returned %v (hit %v), want Unavailable", tc.mode, err, hit())
		}
		if got := exists(tc.key); got != tc.applied {
			t.Errorf("%v: key exists = %v, want %v", tc.mode, got, tc.applied)
		}
	}

	// Late: the caller's context ends at 200 ms; the Put lands after.
	f.Inject(Rule{Method: "/etcdserverpb.KV/Put", Match: onKey("late"), Mode: Late, Delay: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	start := time.Now()
	_, err := cli.Put(ctx, "late", "v")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Errorf("late: Put returned %v after %v, want DeadlineExceeded at 200 ms", err, time.Since(start))
	}
	if exists("late") {
		t.Error("late: the key exists as the caller returns")
	}
	f.Wait()
	if !exists("late") {
		t.Error("late: the held Put was never delivered")
	}

	// The 2nd matching request is hit, not the 1st.
	f.Inject(Rule{Method: "/etcdserverpb.KV/Put", Match: onKey("second"), Nth: 2, Mode: Refuse})
	if _, err := cli.Put(ctxT(t, 5*time.Second), "second", "1"); err != nil {
		t.Errorf("1st put: %v", err)
	}
	if _, err := cli.Put(ctxT(t, 5*time.Second), "second", "2"); status.Code(err) != codes.Unavailable {
		t.Errorf("2nd put: %v, want Unavailable", err)
	}
	if puts != 5 { // the late delivery is not observed again
		t.Errorf("observed %d puts, want 5", puts)
	}

	// A stream: the keepalive's stream refused (KeepAliveOnce opens
	// another: clientv3 retries it).
	lease, err := cli.Grant(ctxT(t, 5*time.Second), 5)
	if err != nil {
		t.Fatal(err)
	}
	streams := 0
	f.Observe(func(method string, _ any) {
		if method == "/etcdserverpb.Lease/LeaseKeepAlive" {
			streams++
		}
	})
	hit := f.Inject(Rule{Method: "/etcdserverpb.Lease/LeaseKeepAlive", Mode: Refuse})
	if _, err := cli.KeepAliveOnce(ctxT(t, 5*time.Second), lease.ID); err != nil || !hit() || streams != 2 {
		t.Errorf("keepalive: %v, hit %v, %d streams; want success on the 2nd stream", err, hit(), streams)
	}
	_, _ = cli.Revoke(ctxT(t, 5*time.Second), lease.ID)
	_, _ = admin.Delete(ctxT(t, 5*time.Second), "", clientv3.WithFromKey())
}
