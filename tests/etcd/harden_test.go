package etcd_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// hostPort returns the host:port of an endpoint URL.
func hostPort(t *testing.T, endpoint string) string {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// proxiedSession returns a session whose client talks to member 0 through a
// fault proxy. The proxy is mended before the session closes.
func proxiedSession(t *testing.T, c *etcdtest.Cluster, opts ...etcd.SessionOption) (*etcd.Session, *embedtest.Proxy) {
	t.Helper()
	p := embedtest.StartProxy(t, hostPort(t, c.Endpoint(0)))
	cli := c.Client(t, func(cfg *clientv3.Config) { cfg.Endpoints = []string{p.URL()} })
	s, err := etcd.NewSession(context.Background(), cli, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	t.Cleanup(p.Mend) // runs first
	return s, p
}

// waitFor polls cond every 2 ms until it holds, and fails t if it does not
// within bound. It returns how long it took.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > bound {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start)
}

// within fails t if d exceeds bound.
func within(t *testing.T, what string, d, bound time.Duration) {
	t.Helper()
	if d > bound {
		t.Fatalf("%s took %v, bound %v", what, d, bound)
	}
	t.Logf("%s: %v", what, d)
}

// waitQueued waits until name has n keys in etcd.
func waitQueued(t *testing.T, cli *clientv3.Client, name string, n int) {
	t.Helper()
	waitFor(t, 5*time.Second, name+" queue", func() bool { return len(keys(t, cli, name+"/")) >= n })
}

// Defect 2: Unlock with a cancelled context still releases the key, in the
// background, and the session can lock the name again.
func TestUnlockCancelledContext(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	s := newSession(t, c, etcd.WithTTL(5*time.Second))
	m := newMutex(t, s, "unlock-cancelled")
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	start := time.Now()
	err = g.Unlock(cctx)
	within(t, "Unlock(cancelled ctx)", time.Since(start), 100*time.Millisecond)
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Unlock(cancelled): %v, want nil or context.Canceled", err)
	}
	if !errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) {
		t.Fatalf("grant cause %v, want ErrReleased", context.Cause(g.Context()))
	}
	d := waitFor(t, 2*time.Second, "key released", func() bool { return len(keys(t, cli, "unlock-cancelled/")) == 0 })
	t.Logf("key gone %v after Unlock", d)
	var g2 *etcd.Grant
	waitFor(t, time.Second, "TryLock through the same session", func() bool {
		g2, err = m.TryLock(ctx)
		return err == nil
	})
	if g2.Token() <= g.Token() {
		t.Fatalf("token %d not above %d", g2.Token(), g.Token())
	}
	if err := g2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Defect 1: with the store frozen, Unlock and a guarded Txn honour their
// contexts; Unlock of a grant already lost returns at once; the release goes
// on in the background once the store is back.
func TestUnlockFrozenStore(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()

	t.Run("held", func(t *testing.T) {
		s, p := proxiedSession(t, c, etcd.WithTTL(10*time.Second))
		m := newMutex(t, s, "frozen-unlock")
		g, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p.Pause()
		txnDone := make(chan time.Duration, 1)
		go func() {
			tctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			start := time.Now()
			_, _ = g.Txn(tctx, clientv3.OpPut("frozen-unlock-data", "x"))
			txnDone <- time.Since(start)
		}()
		uctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		start := time.Now()
		err = g.Unlock(uctx)
		within(t, "Unlock(1 s) on a frozen store", time.Since(start), time.Second+100*time.Millisecond)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Unlock: %v, want DeadlineExceeded", err)
		}
		within(t, "guarded Txn(1 s) during Unlock", <-txnDone, time.Second+100*time.Millisecond)
		p.Mend()
		d := waitFor(t, 3*time.Second, "key released after the store came back", func() bool { return len(keys(t, cli, "frozen-unlock/")) == 0 })
		t.Logf("released %v after the store came back", d)
		waitFor(t, time.Second, "TryLock through the same session", func() bool {
			g2, err := m.TryLock(ctx)
			if err != nil {
				return false
			}
			return g2.Unlock(ctx) == nil
		})
	})

	t.Run("lost", func(t *testing.T) {
		s, p := proxiedSession(t, c, etcd.WithTTL(2*time.Second))
		g, err := newMutex(t, s, "frozen-lost").Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p.Pause()
		select {
		case <-g.Context().Done():
		case <-time.After(3 * time.Second):
			t.Fatal("grant not lost 3 s after the store froze (TTL 2 s)")
		}
		start := time.Now()
		err = g.Unlock(context.Background())
		within(t, "Unlock(Background) of a lost grant", time.Since(start), 100*time.Millisecond)
		if !errors.Is(err, holdfast.ErrNotHeld) || !errors.Is(err, holdfast.ErrSessionLost) {
			t.Fatalf("Unlock of lost grant: %v, want ErrNotHeld wrapping ErrSessionLost", err)
		}
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		start = time.Now()
		if _, err := g.Txn(tctx, clientv3.OpPut("frozen-lost-data", "x")); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Fatalf("Txn on lost grant: %v", err)
		}
		within(t, "Txn on a lost grant", time.Since(start), 100*time.Millisecond)
		start = time.Now()
		_ = s.Close() // revoke bounded by min(TTL, 5 s)
		within(t, "Close on a frozen store", time.Since(start), 2*time.Second+500*time.Millisecond)
	})
}

// Defect 3 and issue 7.7: Lock and TryLock return when their context ends,
// even with the store frozen, and what they left is removed once the store
// is back.
func TestLockBoundedFrozenStore(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	hg, err := newMutex(t, newSession(t, c, etcd.WithTTL(10*time.Second)), "frozen").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, p := proxiedSession(t, c, etcd.WithTTL(10*time.Second))

	// A waiter queued behind the holder; the store freezes mid-wait.
	m := newMutex(t, s, "frozen")
	deadline := time.Now().Add(2 * time.Second)
	lctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := m.Lock(lctx)
		errc <- err
	}()
	waitQueued(t, cli, "frozen", 2)
	p.Pause()

	// Meanwhile, on the frozen store: a TryLock (1 s) and a Lock (2 s) of
	// free names.
	type result struct {
		late time.Duration // after the context's deadline
		err  error
	}
	try, lock := make(chan result, 1), make(chan result, 1)
	go func() {
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		dl, _ := tctx.Deadline()
		_, err := newMutex(t, s, "frozen-try").TryLock(tctx)
		try <- result{time.Since(dl), err}
	}()
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		dl, _ := lctx.Deadline()
		_, err := newMutex(t, s, "frozen-lock").Lock(lctx)
		lock <- result{time.Since(dl), err}
	}()

	err = <-errc
	within(t, "queued Lock(2 s), past its deadline", time.Since(deadline), 100*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued Lock: %v, want DeadlineExceeded", err)
	}
	for what, ch := range map[string]chan result{"TryLock(1 s)": try, "Lock(2 s)": lock} {
		r := <-ch
		within(t, what+" on a frozen store, past its deadline", r.late, 100*time.Millisecond)
		if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Fatalf("%s: %v, want DeadlineExceeded", what, r.err)
		}
	}

	p.Mend()
	d := waitFor(t, 3*time.Second, "leftovers removed", func() bool {
		ks := keys(t, cli, "frozen")
		return len(ks) == 1 && ks[0] == hg.Key()
	})
	t.Logf("leftovers removed %v after the store came back", d)
	if err := hg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "TryLock through the same session", func() bool {
		g, err := m.TryLock(ctx)
		return err == nil && g.Unlock(ctx) == nil
	})
}

// A waiter's Lock ends within milliseconds of its session's end.
func TestLockEndsWithSession(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	hg, err := newMutex(t, newSession(t, c, etcd.WithTTL(10*time.Second)), "sess-end").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hg.Unlock(ctx)
	s, p := proxiedSession(t, c, etcd.WithTTL(2*time.Second))
	m := newMutex(t, s, "sess-end")
	errc := make(chan error, 1)
	go func() {
		_, err := m.Lock(ctx)
		errc <- err
	}()
	waitQueued(t, cli, "sess-end", 2)
	p.Pause()
	select {
	case <-s.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("session not lost 3 s after the store froze (TTL 2 s)")
	}
	ended := time.Now()
	select {
	case err := <-errc:
		within(t, "Lock after its session ended", time.Since(ended), 100*time.Millisecond)
		if !errors.Is(err, holdfast.ErrSessionLost) {
			t.Fatalf("Lock: %v, want ErrSessionLost", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Lock still waiting 1 s after its session ended")
	}
}

// Defect 5: a guarded Txn refuses ops on the lock's own keys, before any
// request.
func TestTxnRefusesLockKeys(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	s := newSession(t, c, etcd.WithTTL(5*time.Second))
	g, err := newMutex(t, s, "txn-own").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Unlock(ctx)
	data := clientv3.OpPut("txn-own-data", "x")
	for name, op := range map[string]clientv3.Op{
		"put holder key":     clientv3.OpPut(g.Key(), "x"),
		"put other under":    clientv3.OpPut("txn-own/abc", "x"),
		"delete prefix":      clientv3.OpDelete("txn-own/", clientv3.WithPrefix()),
		"delete parent pfx":  clientv3.OpDelete("txn", clientv3.WithPrefix()),
		"delete range over":  clientv3.OpDelete("a", clientv3.WithRange("z")),
		"delete from key":    clientv3.OpDelete("t", clientv3.WithFromKey()),
		"get holder key":     clientv3.OpGet(g.Key()),
		"nested txn put":     clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpPut(g.Key(), "x")}, nil),
		"nested txn else":    clientv3.OpTxn(nil, nil, []clientv3.Op{clientv3.OpDelete(g.Key())}),
		"delete range start": clientv3.OpDelete("txn-own/", clientv3.WithRange("txn-own0")),
	} {
		if _, err := g.Txn(ctx, data, op); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if resp, err := cli.Get(ctx, "txn-own-data"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("a refused Txn applied its ops: %v %v", resp, err)
	}
	for name, op := range map[string]clientv3.Op{
		"the name itself":   clientv3.OpPut("txn-own", "x"),
		"sibling after pfx": clientv3.OpPut("txn-own0", "x"),
		"longer name":       clientv3.OpPut("txn-owner/x", "x"),
		"range before pfx":  clientv3.OpDelete("a", clientv3.WithRange("txn-own/")),
		"from after pfx":    clientv3.OpDelete("txn-own0", clientv3.WithFromKey()),
	} {
		if _, err := g.Txn(ctx, op); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if g.Context().Err() != nil {
		t.Fatal("grant lost")
	}
	if resp, err := cli.Get(ctx, g.Key()); err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease != int64(s.Lease()) {
		t.Fatalf("holder key changed: %v %v", resp, err)
	}
}

// Defect 6: NewSession and Dial on an unreachable endpoint return within the
// default connect timeout (or ctx's deadline) and say why.
func TestNewSessionUnreachable(t *testing.T) {
	t.Parallel() // no server, and waiting out a timeout: beside the other long tests
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + ln.Addr().String()
	ln.Close() // a closed port: connections are refused
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	start := time.Now()
	_, err = etcd.NewSession(context.Background(), cli, etcd.WithTTL(5*time.Second))
	within(t, "NewSession(Background)", time.Since(start), 5*time.Second+time.Second) // the documented 5 s without a deadline
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("NewSession: %v, want DeadlineExceeded and the connection error", err)
	}
	t.Logf("NewSession: %v", err)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start = time.Now()
	_, err = etcd.Dial(ctx, []string{endpoint})
	within(t, "Dial(1 s)", time.Since(start), 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Dial: %v, want the connection error", err)
	}
}

// Dial owns its client: Close closes it.
func TestDial(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	s, err := etcd.Dial(ctx, c.Endpoints(), etcd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	g, err := newMutex(t, s, "dial").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Client().Ctx().Err(); err == nil {
		t.Fatal("Close did not close the client Dial created")
	}
	for _, bad := range [][]string{nil, {}} {
		if _, err := etcd.Dial(ctx, bad); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("Dial(%v): %v", bad, err)
		}
	}
	if _, err := etcd.Dial(ctx, c.Endpoints(), etcd.WithTTL(time.Second)); !errors.Is(err, holdfast.ErrInvalidTTL) {
		t.Errorf("Dial with bad TTL: %v", err)
	}
}

// Defect 9: the grant's context reports the loss as soon as the safe
// deadline has passed, before any timer could fire; the deadline moves
// forward with renewals.
func TestContextEndsAtDeadline(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	s, p := proxiedSession(t, c, etcd.WithTTL(2*time.Second))
	g, err := newMutex(t, s, "deadline").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := g.Deadline()
	if first.IsZero() || time.Until(first) > 2*time.Second {
		t.Fatalf("deadline %v from now", time.Until(first))
	}
	waitFor(t, 2*time.Second, "deadline moved by a renewal", func() bool { return g.Deadline().After(first) })
	p.Pause() // no renewal from now on
	d := g.Deadline()
	time.Sleep(time.Until(d) - 2*time.Millisecond)
	// With one P, the runtime cannot run the deadline's timer while this
	// goroutine spins (preemption takes 10 ms): the check must be
	// synchronous.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for time.Now().Before(d) {
	}
	err = g.Context().Err()
	if err == nil {
		t.Fatal("grant context live after its deadline passed")
	}
	if !errors.Is(context.Cause(g.Context()), holdfast.ErrSessionLost) {
		t.Fatalf("cause %v, want ErrSessionLost", context.Cause(g.Context()))
	}
}

// Issue 7.3, the release guard: a release that reaches etcd after the key was
// deleted and created again (a newer incarnation, say by an operator) must
// not delete it.
func TestStaleUnlockLeavesNewerKey(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	s, p := proxiedSession(t, c, etcd.WithTTL(10*time.Second))
	g, err := newMutex(t, s, "stale-unlock").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.Pause() // the holder cannot hear of what follows
	if _, err := cli.Delete(ctx, g.Key()); err != nil {
		t.Fatal(err)
	}
	put, err := cli.Put(ctx, g.Key(), "newer", clientv3.WithLease(s.Lease()))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- g.Unlock(ctx) }()
	// Nothing observable marks the moment Unlock has sent its release into
	// the frozen connection; what matters is only that etcd sees it after
	// the put above, which holds whenever it is sent.
	time.Sleep(50 * time.Millisecond)
	p.Mend()
	if err := <-errc; !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("stale Unlock: %v, want ErrNotHeld", err)
	}
	resp, err := cli.Get(ctx, g.Key())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != put.Header.Revision {
		t.Fatalf("the newer key was deleted by a stale Unlock: %v", resp.Kvs)
	}
}

// The same, through the same Mutex (the scenario of issue 7.3): the grant
// is lost to an operator's delete, the name is locked again, and the old
// grant's Unlock leaves the new grant alone.
func TestStaleUnlockSameMutex(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	s := newSession(t, c, etcd.WithTTL(10*time.Second))
	m := newMutex(t, s, "stale-same")
	g1, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, g1.Key()); err != nil {
		t.Fatal(err)
	}
	<-g1.Context().Done()
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	g2, err := m.Lock(lctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := g1.Unlock(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("stale Unlock: %v, want ErrNotHeld", err)
	}
	resp, err := cli.Get(ctx, g2.Key())
	if err != nil || len(resp.Kvs) != 1 || holdfast.Token(resp.Kvs[0].CreateRevision) != g2.Token() {
		t.Fatalf("new grant's key after stale Unlock: %v %v", resp, err)
	}
	if g2.Context().Err() != nil {
		t.Fatal("new grant ended by the stale Unlock")
	}
	if err := g2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// The txn guard: a guarded Txn that reaches etcd after the key was deleted
// (before the holder heard of it) applies nothing.
func TestGuardedTxnAfterUnnoticedDelete(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	s, p := proxiedSession(t, c, etcd.WithTTL(10*time.Second))
	g, err := newMutex(t, s, "txn-unnoticed").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.Pause()
	if _, err := cli.Delete(ctx, g.Key()); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := g.Txn(ctx, clientv3.OpPut("txn-unnoticed-data", "stale"))
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond) // see TestStaleUnlockLeavesNewerKey
	p.Mend()
	if err := <-errc; !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("Txn after the key was deleted: %v, want ErrNotHeld", err)
	}
	if resp, err := cli.Get(ctx, "txn-unnoticed-data"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("guarded write applied after the key was deleted: %v %v", resp, err)
	}
}

// The own-key re-check: a waiter whose key was deleted while it waited must
// not take the lock when its predecessor leaves.
func TestWaiterKeyDeleted(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	hg, err := newMutex(t, newSession(t, c, etcd.WithTTL(10*time.Second)), "waiter-deleted").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ws := newSession(t, c, etcd.WithTTL(10*time.Second))
	type result struct {
		g   *etcd.Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := newMutex(t, ws, "waiter-deleted").Lock(ctx)
		got <- result{g, err}
	}()
	waitQueued(t, cli, "waiter-deleted", 2)
	for _, k := range keys(t, cli, "waiter-deleted/") {
		if k != hg.Key() {
			if _, err := cli.Delete(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := hg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err == nil {
			_ = r.g.Unlock(ctx)
			t.Fatal("a waiter whose key was deleted was granted the lock")
		}
		if !errors.Is(r.err, holdfast.ErrLost) {
			t.Fatalf("waiter: %v, want ErrLost", r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter still waiting 5 s after its key was deleted and the holder left")
	}
	waitFor(t, 2*time.Second, "no key left", func() bool { return len(keys(t, cli, "waiter-deleted/")) == 0 })
}

// Item 18: a user without access to the lock's prefix gets
// ErrPermissionDenied.
func TestPermissionDenied(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	root := c.Client(t)
	for _, step := range []func() error{
		func() error { _, err := root.RoleAdd(ctx, "root"); return err },
		func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "other"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "other", "other/", clientv3.GetPrefixRangeEnd("other/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "alice", "alicepw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "alice", "other"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	admin := c.Client(t, func(cfg *clientv3.Config) { cfg.Username, cfg.Password = "root", "rootpw" })
	defer func() {
		if _, err := admin.AuthDisable(ctx); err != nil {
			t.Errorf("auth disable: %v", err)
		}
		_, _ = root.UserDelete(ctx, "alice")
		_, _ = root.UserDelete(ctx, "root")
		_, _ = root.RoleDelete(ctx, "other")
		_, _ = root.RoleDelete(ctx, "root")
	}()
	alice := c.Client(t, func(cfg *clientv3.Config) { cfg.Username, cfg.Password = "alice", "alicepw" })
	s, err := etcd.NewSession(ctx, alice, etcd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, how := range []string{"Lock", "TryLock"} {
		m := newMutex(t, s, "secret-"+how)
		var err error
		if how == "Lock" {
			_, err = m.Lock(ctx)
		} else {
			_, err = m.TryLock(ctx)
		}
		if !errors.Is(err, holdfast.ErrPermissionDenied) {
			t.Fatalf("%s without access: %v, want ErrPermissionDenied", how, err)
		}
	}
	g, err := newMutex(t, s, "other/job").Lock(ctx)
	if err != nil {
		t.Fatalf("lock under alice's prefix: %v", err)
	}
	if _, err := g.Txn(ctx, clientv3.OpPut("elsewhere", "x")); !errors.Is(err, holdfast.ErrPermissionDenied) {
		t.Fatalf("guarded write outside alice's prefix: %v, want ErrPermissionDenied", err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Defect 12: compaction while held. A watch re-created from a compacted
// revision is resumed from one that exists after one read, without a loop,
// and a deletion is still noticed at once.
func TestCompactionWhileHeld(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	s := newSession(t, c, etcd.WithTTL(15*time.Second))
	g, err := newMutex(t, s, "compact").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var resp *clientv3.PutResponse
	for range 10 {
		if resp, err = cli.Put(ctx, "compact-other", "x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	before, confirmed := watchCreates(s)
	breakWatch(s) // reconnect: the watch is created again from the compacted revision
	waitFor(t, 5*time.Second, "watch re-created after the compaction", func() bool {
		q, _ := watchCreates(s)
		return q >= before+2 // once from the compacted revision, once from the read's
	})
	// No loop: it stays re-created. (One more creation may still be on its
	// way when the count first reaches before+2, as when the reconnect
	// races the compacted answer; a loop goes on creating.)
	settled, _ := watchCreates(s)
	time.Sleep(time.Second)
	mid, _ := watchCreates(s)
	time.Sleep(time.Second)
	if q, _ := watchCreates(s); q != mid || mid-settled > 1 {
		t.Fatalf("watch re-created %d more times in 2 s after a compaction (%d in the second)", q-settled, q-mid)
	}
	if g.Context().Err() != nil {
		t.Fatalf("grant lost to a compaction: %v", context.Cause(g.Context()))
	}
	// Confirmed twice: from the compacted revision (then cancelled), and
	// from the read's.
	waitFor(t, 2*time.Second, "watch confirmed", func() bool { _, c := watchCreates(s); return c >= confirmed+2 })
	start := time.Now()
	if _, err := cli.Delete(ctx, g.Key()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.Context().Done():
		within(t, "deletion noticed after a compaction", time.Since(start), 100*time.Millisecond)
	case <-time.After(2 * time.Second):
		t.Fatal("deletion not noticed within 2 s after a compaction")
	}
}

// Defect 13: a frozen follower does not end sessions: each keepalive attempt
// is bounded, so the next one reaches a healthy member.
func TestFrozenFollowerKeepsSessions(t *testing.T) {
	t.Parallel() // its own etcd, and mostly waiting: beside the other long tests
	c := etcdtest.EtcdCluster(t, 3)
	leader, err := c.WaitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var proxies []*embedtest.Proxy
	var eps []string
	for i := range 3 {
		p := embedtest.StartProxy(t, hostPort(t, c.Endpoint(i)))
		proxies = append(proxies, p)
		eps = append(eps, p.URL())
	}
	var sessions []*etcd.Session
	for range 6 {
		cli := c.Client(t, func(cfg *clientv3.Config) { cfg.Endpoints = eps })
		s, err := etcd.NewSession(context.Background(), cli, etcd.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		sessions = append(sessions, s)
	}
	frozen := proxies[(leader+1)%3]
	frozen.Pause()
	t.Cleanup(frozen.Mend)
	time.Sleep(8 * time.Second) // the fault's duration
	frozen.Mend()
	for i, s := range sessions {
		if err := s.Err(); err != nil {
			t.Errorf("session %d lost while one follower was frozen: %v", i, err)
		}
	}
}

// A revoked lease or a deleted key is noticed within 100 ms.
func TestNoticeUnder100ms(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	for _, how := range []string{"revoke", "delete"} {
		s := newSession(t, c, etcd.WithTTL(15*time.Second))
		g, err := newMutex(t, s, "notice100-"+how).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Second, "watch confirmed", func() bool { _, c := watchCreates(s); return c >= 1 })
		start := time.Now()
		if how == "revoke" {
			_, err = cli.Revoke(ctx, s.Lease())
		} else {
			_, err = cli.Delete(ctx, g.Key())
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-g.Context().Done():
			within(t, how+" noticed", time.Since(start), 100*time.Millisecond)
		case <-time.After(2 * time.Second):
			t.Fatalf("%s not noticed within 2 s", how)
		}
		if !errors.Is(context.Cause(g.Context()), holdfast.ErrLost) {
			t.Fatalf("%s: cause %v", how, context.Cause(g.Context()))
		}
	}
}

// Nested names: a lock on "a" fails with ErrConflict when it finds keys of
// the longer name "a/b", and removes what it wrote; "a/b" is unaffected.
func TestNestedNamesConflict(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	inner, err := newMutex(t, newSession(t, c, etcd.WithTTL(10*time.Second)), "nest/a/b").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	outer := newMutex(t, newSession(t, c, etcd.WithTTL(10*time.Second)), "nest/a")
	if _, err := outer.TryLock(ctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Fatalf("TryLock of a prefix of a held name: %v, want ErrConflict", err)
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := outer.Lock(lctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Fatalf("Lock of a prefix of a held name: %v, want ErrConflict", err)
	}
	within(t, "Lock refused for a conflict", time.Since(start), time.Second)
	waitFor(t, 2*time.Second, "the refused Lock's key removed", func() bool {
		ks := keys(t, cli, "nest/a/")
		return len(ks) == 1 && ks[0] == inner.Key()
	})
	if inner.Context().Err() != nil {
		t.Fatal("the longer name's grant ended")
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The other way round: holding "a" does not block "a/b".
	g, err := outer.Lock(lctx)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Unlock(ctx)
	g2, err := newMutex(t, newSession(t, c, etcd.WithTTL(10*time.Second)), "nest/a/b").TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock of a longer name while the shorter is held: %v", err)
	}
	_ = g2.Unlock(ctx)
}

// The session's watch stream survives the loss of its member: after a
// restart every grant's watch is created again, a deletion is noticed, and
// Close returns promptly.
func TestWatchSurvivesRestart(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	s := newSession(t, c, etcd.WithTTL(15*time.Second))
	g, err := newMutex(t, s, "restart").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "watch confirmed", func() bool { _, c := watchCreates(s); return c >= 1 })
	if err := c.Stop(0); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "watch created again", func() bool { _, c := watchCreates(s); return c >= 2 })
	cli := c.Client(t)
	start := time.Now()
	if _, err := cli.Delete(ctx, g.Key()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.Context().Done():
		within(t, "deletion noticed after a restart", time.Since(start), 100*time.Millisecond)
	case <-time.After(2 * time.Second):
		t.Fatal("deletion not noticed within 2 s after a restart")
	}
	start = time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	within(t, "Close", time.Since(start), time.Second)
}

// A Lock that etcd refuses because the session's lease is gone (revoked by
// an operator before the next keepalive could tell) fails with
// ErrSessionLost and ends the session.
func TestLockAfterLeaseRevoked(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	s := newSession(t, c, etcd.WithTTL(15*time.Second))
	m := newMutex(t, s, "revoked-lease")
	if _, err := c.Client(t).Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{"TryLock", "Lock"} {
		var err error
		if how == "Lock" {
			_, err = m.Lock(ctx)
		} else {
			_, err = m.TryLock(ctx)
		}
		if !errors.Is(err, holdfast.ErrSessionLost) {
			t.Fatalf("%s after the lease was revoked: %v, want ErrSessionLost", how, err)
		}
	}
	if !errors.Is(s.Err(), holdfast.ErrSessionLost) {
		t.Fatalf("session: %v, want ErrSessionLost", s.Err())
	}
	if ks := keys(t, c.Client(t), "revoked-lease/"); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// Misuse and edge cases: nil contexts are refused before any request, a
// second acquisition of a name in progress through the same session makes
// TryLock fail at once, a closed client ends the session, and an endpoint
// that accepts connections but never answers gives a plain timeout.
func TestMisuse(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	cli := c.Client(t)
	//lint:ignore SA1012 checks that a nil context is refused, not a panic
	if _, err := etcd.NewSession(nil, cli); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("NewSession(nil ctx): %v", err)
	}
	//lint:ignore SA1012 checks that a nil context is refused, not a panic
	if _, err := etcd.Dial(nil, c.Endpoints()); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Dial(nil ctx): %v", err)
	}
	s := newSession(t, c, etcd.WithTTL(5*time.Second))
	hg, err := newMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), "misuse").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := newMutex(t, s, "misuse")
	lctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := m.Lock(lctx)
		errc <- err
	}()
	waitQueued(t, cli, "misuse", 2)
	if _, err := m.TryLock(ctx); !errors.Is(err, holdfast.ErrLocked) {
		t.Errorf("TryLock while a Lock of the name waits through the same session: %v, want ErrLocked", err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Lock: %v", err)
	}
	if err := hg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1012 checks that a nil context is refused, not a panic
	if _, err := g.Txn(nil, clientv3.OpPut("misuse-data", "x")); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Txn(nil ctx): %v", err)
	}

	own, err := c.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	s2, err := etcd.NewSession(ctx, own, etcd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	own.Close()
	select {
	case <-s2.Context().Done():
		if !errors.Is(s2.Err(), holdfast.ErrSessionLost) {
			t.Errorf("session after its client closed: %v, want ErrSessionLost", s2.Err())
		}
	case <-time.After(time.Second):
		t.Error("session still live 1 s after its client was closed")
	}

	p := embedtest.StartProxy(t, hostPort(t, c.Endpoint(0)))
	p.Pause()
	defer p.Mend()
	tctx, tcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer tcancel()
	start := time.Now()
	_, err = etcd.Dial(tctx, []string{p.URL()})
	within(t, "Dial(500 ms) to a frozen endpoint", time.Since(start), time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "last connection error") {
		t.Errorf("Dial to a frozen endpoint: %v, want a plain DeadlineExceeded (it accepts connections)", err)
	}
}

// A lock on a claim's name is refused: the claim's record "<name>/.claim"
// stays (it remembers the last period), so a Lock that queued behind it
// would wait for ever (it did: Lock waited until its context ended).
func TestClaimNameConflict(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	s := newSession(t, c, etcd.WithTTL(5*time.Second))
	o, err := etcd.NewOnce(s, "nest/claimed", holdfast.Schedule{Every: time.Hour, AtMost: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := o.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	m := newMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), "nest/claimed")
	if _, err := m.TryLock(ctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Fatalf("TryLock of a claim's name: %v, want ErrConflict", err)
	}
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := m.Lock(lctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Fatalf("Lock of a claim's name: %v, want ErrConflict", err)
	}
	within(t, "Lock refused for a claim's record", time.Since(start), time.Second)
}
