package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

func newSemaphore(t *testing.T, s *etcd.Session, name string, limit int) *etcd.Semaphore {
	t.Helper()
	m, err := etcd.NewSemaphore(s, name, limit)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// lockAsync starts l.Lock(ctx) and returns a channel of its outcome.
func lockAsync(ctx context.Context, lock func(context.Context) (*etcd.Grant, error)) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		g, err := lock(ctx)
		ch <- lockResult{g, err}
	}()
	return ch
}

type lockResult struct {
	g   *etcd.Grant
	err error
}

// granted waits up to bound for a successful outcome on ch.
func granted(t *testing.T, ch <-chan lockResult, bound time.Duration, what string) *etcd.Grant {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.g
	case <-time.After(bound):
		t.Fatalf("%s: not granted within %v", what, bound)
	}
	return nil
}

// waiting checks that nothing arrives on ch for d.
func waiting(t *testing.T, ch <-chan lockResult, d time.Duration, what string) {
	t.Helper()
	select {
	case r := <-ch:
		if r.err == nil {
			t.Fatalf("%s: granted, want it to wait", what)
		}
		t.Fatalf("%s: %v, want it to wait", what, r.err)
	case <-time.After(d):
	}
}

// The layout (key "<name>/<lease hex>" with the limit in its value, token =
// create revision), never more than limit holders (checked with a counter
// updated only through each permit's guarded Txn), and the limit reached.
func TestSemaphoreLimitFenced(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	const name, limit, workers, rounds = "sem/fenced", 3, 8, 6

	s := newSession(t, c, etcd.WithTTL(5*time.Second))
	g, err := newSemaphore(t, s, name, limit).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s/%x", name, int64(s.Lease())); g.Key() != want {
		t.Fatalf("key %q, want %q", g.Key(), want)
	}
	resp, err := cli.Get(ctx, g.Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("own key: %v %v", resp, err)
	}
	if kv := resp.Kvs[0]; string(kv.Value) != "holdfast semaphore limit=3" || holdfast.Token(kv.CreateRevision) != g.Token() || kv.Lease != int64(s.Lease()) {
		t.Fatalf("key %s value %q create %d lease %x; token %d lease %x", kv.Key, kv.Value, kv.CreateRevision, kv.Lease, g.Token(), s.Lease())
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	var inside, most atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		sem := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, limit)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				g, err := sem.Lock(ctx)
				if err != nil {
					errs <- err
					return
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				// A fenced write: only while the permit holds.
				if _, err := g.Txn(ctx, clientv3.OpPut(fmt.Sprintf("sem-data/%d", w), fmt.Sprint(r))); err != nil {
					errs <- err
					return
				}
				time.Sleep(3 * time.Millisecond)
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
	t.Logf("most holders at once: %d (limit %d)", most.Load(), limit)
	if m := most.Load(); m > limit || m < 2 {
		t.Fatalf("most holders at once %d, want 2..%d", m, limit)
	}
	if ks := keys(t, cli, name+"/"); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// Permits go in order of arrival, and each handoff is prompt (no 100 ms
// stall of a watch from a past revision).
func TestSemaphoreFIFO(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	const name = "sem/fifo"
	var holders []*etcd.Grant
	for range 2 {
		g, err := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 2).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, g)
	}
	var waiters []<-chan lockResult
	for i := range 4 {
		sem := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 2)
		waiters = append(waiters, lockAsync(ctx, sem.Lock))
		waitQueued(t, cli, name, 3+i)
	}
	waiting(t, waiters[0], 100*time.Millisecond, "first waiter while full")
	for i, w := range waiters {
		start := time.Now()
		if err := holders[0].Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		holders = append(holders[1:], granted(t, w, 2*time.Second, fmt.Sprintf("waiter %d", i)))
		within(t, fmt.Sprintf("handoff %d", i), time.Since(start), 80*time.Millisecond)
		if i+1 < len(waiters) {
			waiting(t, waiters[i+1], 20*time.Millisecond, fmt.Sprintf("waiter %d after one release", i+1))
		}
	}
	for _, g := range holders {
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A revoked holder's permit comes back: the waiter is admitted, and the
// holder's grant context ends with ErrLost.
func TestSemaphoreRevokedHolder(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	const name = "sem/revoked"
	hs := newSession(t, c, etcd.WithTTL(5*time.Second))
	hg, err := newSemaphore(t, hs, name, 1).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := lockAsync(ctx, newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 1).Lock)
	waitQueued(t, cli, name, 2)
	waiting(t, w, 50*time.Millisecond, "waiter while full")
	start := time.Now()
	if _, err := cli.Revoke(ctx, hs.Lease()); err != nil {
		t.Fatal(err)
	}
	g := granted(t, w, 2*time.Second, "waiter after the holder's lease was revoked")
	within(t, "permit back after revoke", time.Since(start), 200*time.Millisecond)
	select {
	case <-hg.Context().Done():
	case <-time.After(time.Second):
		t.Fatal("revoked holder not told")
	}
	if !errors.Is(context.Cause(hg.Context()), holdfast.ErrLost) {
		t.Fatalf("holder's cause %v, want ErrLost", context.Cause(hg.Context()))
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Cancelling a waiting Lock returns at once and leaves no key; the holders
// are unaffected.
func TestSemaphoreCancelWaiting(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	const name = "sem/cancel"
	hg, err := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 1).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ws := newSession(t, c, etcd.WithTTL(5*time.Second))
	sem := newSemaphore(t, ws, name, 1)
	cctx, cancel := context.WithCancel(ctx)
	w := lockAsync(cctx, sem.Lock)
	waitQueued(t, cli, name, 2)
	start := time.Now()
	cancel()
	select {
	case r := <-w:
		if !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled Lock: %v, want context.Canceled", r.err)
		}
	case <-time.After(time.Second):
		t.Fatal("cancelled Lock still waiting")
	}
	within(t, "cancelled Lock", time.Since(start), 100*time.Millisecond)
	waitFor(t, 2*time.Second, "waiter key removed", func() bool { return len(keys(t, cli, name+"/")) == 1 })
	if hg.Context().Err() != nil {
		t.Fatal("holder affected by a waiter's cancel")
	}
	if err := hg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The session can take the name again.
	g, err := sem.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TryLock: a permit while there is room, ErrLocked when full, and then
// nothing written (the store's revision does not move).
func TestSemaphoreTryLock(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	const name = "sem/try"
	var gs []*etcd.Grant
	for range 2 {
		g, err := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 2).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	sem := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 2)
	before, err := cli.Get(ctx, "anything")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryLock(ctx); !errors.Is(err, holdfast.ErrLocked) {
		t.Fatalf("TryLock when full: %v, want ErrLocked", err)
	}
	after, err := cli.Get(ctx, "anything")
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision {
		t.Fatalf("a refused TryLock wrote: revision %d -> %d", before.Header.Revision, after.Header.Revision)
	}
	if err := gs[0].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := sem.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock with room: %v", err)
	}
	if g.Token() <= gs[1].Token() {
		t.Fatalf("token %d not above %d", g.Token(), gs[1].Token())
	}
	for _, g := range []*etcd.Grant{g, gs[1]} {
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Bad input fails with ErrInvalidArgument (or ErrInvalidName) before any
// request.
func TestSemaphoreBadInput(t *testing.T) {
	c := etcdtest.Etcd(t)
	var requests atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		requests.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli := c.Client(t, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(count))
	})
	s, err := etcd.NewSession(context.Background(), cli, etcd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	before := requests.Load()
	for _, limit := range []int{0, -1} {
		if _, err := etcd.NewSemaphore(s, "sem/bad", limit); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("limit %d: %v, want ErrInvalidArgument", limit, err)
		}
	}
	if _, err := etcd.NewSemaphore(nil, "sem/bad", 1); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("nil session: %v", err)
	}
	for _, name := range []string{"", "a/", "a//b", "a b", ".x"} {
		if _, err := etcd.NewSemaphore(s, name, 2); !errors.Is(err, holdfast.ErrInvalidName) || !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("name %q: %v, want ErrInvalidName", name, err)
		}
	}
	sem := newSemaphore(t, s, "sem/bad", 2)
	//lint:ignore SA1012 checks that a nil context is refused, not a panic
	if _, err := sem.Lock(nil); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Lock(nil): %v", err)
	}
	//lint:ignore SA1012 checks that a nil context is refused, not a panic
	if _, err := sem.TryLock(nil); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("TryLock(nil): %v", err)
	}
	if n := requests.Load() - before; n != 0 {
		t.Fatalf("bad input sent %d requests", n)
	}
}

// Clients that disagree on the limit: the second fails with ErrConflict
// naming both limits, writes nothing, and the first keeps its permits.
func TestSemaphoreLimitMismatch(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	const name = "sem/mismatch"
	hg, err := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 2).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 3)
	before, err := cli.Get(ctx, "anything")
	if err != nil {
		t.Fatal(err)
	}
	for what, lock := range map[string]func(context.Context) (*etcd.Grant, error){"Lock": other.Lock, "TryLock": other.TryLock} {
		_, err := lock(ctx)
		if !errors.Is(err, holdfast.ErrConflict) || !errors.Is(err, holdfast.ErrLimitMismatch) || !strings.Contains(err.Error(), "limit is 3") || !strings.Contains(err.Error(), "limit 2") {
			t.Fatalf("%s with limit 3 while limit 2 is held: %v, want ErrLimitMismatch (an ErrConflict) naming both limits", what, err)
		}
	}
	after, err := cli.Get(ctx, "anything")
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision {
		t.Fatalf("a refused Lock wrote: revision %d -> %d", before.Header.Revision, after.Header.Revision)
	}
	// The first client's second permit is still there.
	g2, err := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 2).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []*etcd.Grant{hg, g2} {
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Once the name is empty, the other limit may take it over.
	g3, err := other.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := g3.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A Mutex and a Semaphore of the same name: whoever comes second fails with
// ErrConflict, and what it wrote is removed.
func TestSemaphoreMutexConflict(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()

	mg, err := newMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), "sem/m1").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sem := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), "sem/m1", 3)
	for what, lock := range map[string]func(context.Context) (*etcd.Grant, error){"Lock": sem.Lock, "TryLock": sem.TryLock} {
		if _, err := lock(ctx); !errors.Is(err, holdfast.ErrConflict) {
			t.Fatalf("semaphore %s on a held mutex: %v, want ErrConflict", what, err)
		}
	}
	if ks := keys(t, cli, "sem/m1/"); len(ks) != 1 || ks[0] != mg.Key() {
		t.Fatalf("keys %v, want only the mutex holder's", ks)
	}

	sg, err := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), "sem/m2", 3).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := newMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), "sem/m2")
	if _, err := m.Lock(ctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Fatalf("mutex Lock on a held semaphore: %v, want ErrConflict", err)
	}
	// (a session of its own: the failed Lock's cleanup holds m's session's name)
	if _, err := newMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), "sem/m2").TryLock(ctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Fatalf("mutex TryLock on a held semaphore: %v", err)
	}
	waitFor(t, 2*time.Second, "the mutex's key removed", func() bool {
		ks := keys(t, cli, "sem/m2/")
		return len(ks) == 1 && ks[0] == sg.Key()
	})
	for _, g := range []*etcd.Grant{mg, sg} {
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// The own-key re-check: a waiter whose key was deleted while it waited must
// not take a permit when a holder leaves (the etcd/semaphore-own-key guard).
func TestSemaphoreWaiterKeyDeleted(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	const name = "sem/waiter-deleted"
	hg, err := newSemaphore(t, newSession(t, c, etcd.WithTTL(10*time.Second)), name, 1).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ws := newSession(t, c, etcd.WithTTL(10*time.Second))
	w := lockAsync(ctx, newSemaphore(t, ws, name, 1).Lock)
	waitQueued(t, cli, name, 2)
	if _, err := cli.Delete(ctx, fmt.Sprintf("%s/%x", name, int64(ws.Lease()))); err != nil {
		t.Fatal(err)
	}
	if err := hg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-w:
		if r.err == nil {
			_ = r.g.Unlock(ctx)
			t.Fatal("a waiter whose key was deleted was granted a permit")
		}
		if !errors.Is(r.err, holdfast.ErrLost) {
			t.Fatalf("waiter: %v, want ErrLost", r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter still waiting 5 s after its key was deleted and the holder left")
	}
	waitFor(t, 2*time.Second, "no key left", func() bool { return len(keys(t, cli, name+"/")) == 0 })
}

// Only the deletion of a key created before ours frees a place: a waiter
// behind us that gives up does not let us in beside a full set of holders
// (the etcd/semaphore-count guard).
func TestSemaphoreCountsOnlyKeysAhead(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	const name = "sem/ahead"
	hg, err := newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 1).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := lockAsync(ctx, newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 1).Lock)
	waitQueued(t, cli, name, 2)
	cctx, cancel := context.WithCancel(ctx)
	cw := lockAsync(cctx, newSemaphore(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name, 1).Lock)
	waitQueued(t, cli, name, 3)
	cancel()
	if r := <-cw; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", r.err)
	}
	waitFor(t, 2*time.Second, "the cancelled waiter's key removed", func() bool { return len(keys(t, cli, name+"/")) == 2 })
	waiting(t, b, 300*time.Millisecond, "first waiter after a waiter behind it left")
	if err := hg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g := granted(t, b, 2*time.Second, "first waiter after the holder left")
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// rpcsPerAcquisition runs n contenders (one session each, all on one client
// whose unary requests are counted) through rounds acquisitions each of a
// semaphore of limit 4, and returns the unary requests per acquisition
// (join, release, and anything else Lock and Unlock send).
func rpcsPerAcquisition(t *testing.T, c *etcdtest.Cluster, n, rounds int) float64 {
	t.Helper()
	var requests atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		requests.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli := c.Client(t, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(count))
	})
	name := fmt.Sprintf("sem/rpcs-%d", n)
	sems := make([]*etcd.Semaphore, n)
	for i := range sems {
		s, err := etcd.NewSession(context.Background(), cli, etcd.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		sems[i] = newSemaphore(t, s, name, 4)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := requests.Load()
	began := time.Now()
	most := contend(t, ctx, sems, rounds)
	if most > 4 {
		t.Fatalf("%d holders at once, limit 4", most)
	}
	per := float64(requests.Load()-start) / float64(n*rounds)
	t.Logf("%3d contenders, limit 4: %d acquisitions in %v, %.3f unary RPCs per acquisition, most holders at once %d",
		n, n*rounds, time.Since(began).Round(time.Millisecond), per, most)
	return per
}

// flat fails t unless the largest figure is within 10% of the smallest.
func flat(t *testing.T, figures map[int]float64) {
	t.Helper()
	lo, hi := 1e9, 0.0
	for _, f := range figures {
		lo, hi = min(lo, f), max(hi, f)
	}
	if hi > 1.1*lo {
		t.Fatalf("RPCs per acquisition not flat (within 10%%): %v", figures)
	}
}

// Unary RPCs per acquisition stay flat from 2 to 64 contenders (256 in
// TestSemaphoreRPCsFlat256, without -race).
func TestSemaphoreRPCsFlat(t *testing.T) {
	c := etcdtest.Etcd(t)
	figures := map[int]float64{}
	for _, n := range []int{2, 16, 64} {
		figures[n] = rpcsPerAcquisition(t, c, n, max(2, 64/n))
	}
	flat(t, figures)
}

// Churn on 3 members: contenders on different members, some giving up
// while they wait (their keys leave from the middle of the queue), some
// revoked while holding; never more than limit holders (counted in-process
// and with a fenced write per permit), and every waiter that stays is
// eventually admitted.
func TestSemaphoreChurnThreeMembers(t *testing.T) {
	c := etcdtest.EtcdCluster(t, 3)
	admin := c.Client(t)
	ctx := context.Background()
	const name, limit, workers, rounds = "sem/churn", 3, 9, 6
	var inside, most, admitted, gaveUp atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		cli := c.Client(t, func(cfg *clientv3.Config) { cfg.Endpoints = []string{c.Endpoint(w % 3)} })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				s, err := etcd.NewSession(ctx, cli, etcd.WithTTL(5*time.Second))
				if err != nil {
					t.Logf("new session: %v", err) // a loaded 3-member cluster may time a request out
					continue
				}
				sem, err := etcd.NewSemaphore(s, name, limit)
				if err != nil {
					errs <- err
					return
				}
				lctx, cancel := context.WithTimeout(ctx, time.Duration(5+rand.IntN(40))*time.Millisecond)
				if rand.IntN(2) == 0 {
					cancel()
					lctx, cancel = context.WithTimeout(ctx, 10*time.Second)
				}
				g, err := sem.Lock(lctx)
				cancel()
				if err != nil {
					gaveUp.Add(1)
					if !errors.Is(err, context.DeadlineExceeded) {
						errs <- err
					}
					_ = s.Close()
					continue
				}
				admitted.Add(1)
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				if _, err := g.Txn(ctx, clientv3.OpPut(fmt.Sprintf("sem-churn/%d", w), fmt.Sprint(r))); errors.Is(err, holdfast.ErrNotHeld) {
					errs <- err
				} else if err != nil {
					t.Logf("guarded txn: %v", err)
				}
				time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
				inside.Add(-1)
				if r%3 == 2 {
					// Lose the permit from outside; the session notices.
					if _, err := admin.Revoke(ctx, s.Lease()); err == nil {
						<-g.Context().Done()
					} else {
						t.Logf("revoke: %v", err)
					}
				} else if err := g.Unlock(ctx); err != nil {
					errs <- err
				}
				_ = s.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d admitted, %d gave up, most holders at once %d (limit %d)", admitted.Load(), gaveUp.Load(), most.Load(), limit)
	if most.Load() > limit {
		t.Fatalf("%d holders at once, limit %d", most.Load(), limit)
	}
	if admitted.Load() == 0 {
		t.Fatal("nobody admitted")
	}
	waitFor(t, 5*time.Second, "no key left", func() bool { return len(keys(t, admin, name+"/")) == 0 })
}
