package consul

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
)

// lockResult is what a Lock in a goroutine came to.
type lockResult struct {
	g   *Grant
	err error
}

// lockAsync starts m.Lock(ctx) in a goroutine.
func lockAsync(m *Mutex, ctx context.Context) <-chan lockResult {
	res := make(chan lockResult, 1)
	go func() {
		g, err := m.Lock(ctx)
		res <- lockResult{g, err}
	}()
	return res
}

// queueUp starts m.Lock(ctx) and waits until m's queue key is in Consul.
func queueUp(t *testing.T, c *api.Client, m *Mutex, ctx context.Context) <-chan lockResult {
	t.Helper()
	res := lockAsync(m, ctx)
	waitFor(t, 5*time.Second, "queued", func() bool { return slices.Contains(keys(t, c, m.name), m.queueKey()) })
	return res
}

// receive waits up to d for a Lock's result.
func receive(t *testing.T, res <-chan lockResult, d time.Duration, who string) lockResult {
	t.Helper()
	select {
	case r := <-res:
		return r
	case <-time.After(d):
		t.Fatalf("%s: Lock did not return within %v", who, d)
		return lockResult{}
	}
}

// lockKeyNow reads the lock key.
func lockKeyNow(t *testing.T, c *api.Client, name string) *api.KVPair {
	t.Helper()
	pair, _, err := c.KV().Get(LockKey(name), nil)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// holderKnowing returns a grant of a holder that knows the waiters queued
// behind it: a foreign holder (api.Lock, to which nobody announces) holds,
// x queues, then the waiters queue, and the foreign holder releases, so
// that x takes the free lock and reads the queue in the same transaction.
func holderKnowing(t *testing.T, c *api.Client, name string, x *Mutex, waiters ...*Mutex) (*Grant, []<-chan lockResult) {
	t.Helper()
	release := foreignHolder(t, c, name)
	xres := queueUp(t, c, x, timeout(t, 30*time.Second))
	var res []<-chan lockResult
	for _, w := range waiters {
		res = append(res, queueUp(t, c, w, timeout(t, 30*time.Second)))
	}
	release()
	r := receive(t, xres, 5*time.Second, "x")
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.g, res
}

// foreignHolder takes the lock with api.Lock and returns its release.
func foreignHolder(t *testing.T, c *api.Client, name string) (release func()) {
	t.Helper()
	l, err := c.LockOpts(&api.LockOptions{Key: LockKey(name), SessionTTL: "10s"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(nil); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := l.Unlock(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHandoffFIFO: each holder hands the lock directly to the head of the
// queue (the lock key is never deleted in between), in queue order, with
// strictly increasing tokens.
func TestHandoffFIFO(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	x := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	var ws []*Mutex
	var takes []*embedtest.Fault // a waiter's own acquire of the lock key
	for range 4 {
		wc, ft := faultClient(t, a)
		ws = append(ws, newMutex(t, newSession(t, wc, WithLockDelay(0)), name))
		takes = append(takes, ft.Inject(embedtest.TxnHas(string(api.KVLock), LockKey(name)), 1, embedtest.FaultRefuse))
	}
	g, res := holderKnowing(t, c, name, x, ws...)
	prev := x
	for i := range ws {
		if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		r := receive(t, res[i], 5*time.Second, "waiter")
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		for j := i + 1; j < len(ws); j++ {
			select {
			case r := <-res[j]:
				t.Fatalf("waiter %d got the lock (%v) before waiter %d released it", j, r.err, i)
			default:
			}
		}
		pair := lockKeyNow(t, c, name)
		if pair == nil || pair.Session != ws[i].s.id || tokenOf(pair) != uint64(r.g.Token()) {
			t.Fatalf("waiter %d: lock key %+v, want held by its session at its token %d", i, pair, r.g.Token())
		}
		// Handed off: the waiter never sent an acquire of its own (it would
		// have, had the key been released for it to take).
		select {
		case <-takes[i].Fired():
			t.Errorf("waiter %d acquired the lock key itself: released, not handed off", i)
		default:
		}
		if r.g.Token() <= g.Token() {
			t.Errorf("waiter %d: token %d, not above the previous holder's %d", i, r.g.Token(), g.Token())
		}
		if slices.Contains(keys(t, c, name), prev.queueKey()) {
			t.Errorf("waiter %d: the previous holder's queue key left after the handoff", i)
		}
		g, prev = r.g, ws[i]
	}
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Errorf("keys left: %q", ks)
	}
}

// TestHandoffToCancelledWaiter: the lock is handed to the head of the queue
// while that waiter cannot see it, and then the waiter gives up. Its cleanup
// releases the lock it was handed, so the next waiter gets it at once.
func TestHandoffToCancelledWaiter(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	p, pc := proxied(t, a)
	x := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	w1 := newMutex(t, newSession(t, pc, WithLockDelay(0)), name)
	w2 := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)

	first := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	g0, err := first.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	xres := queueUp(t, c, x, timeout(t, 10*time.Second))
	w1ctx, w1cancel := context.WithCancel(context.Background())
	defer w1cancel()
	w1res := queueUp(t, c, w1, w1ctx)
	w2res := queueUp(t, c, w2, timeout(t, 30*time.Second))
	if err := g0.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := receive(t, xres, 5*time.Second, "x")
	if r.err != nil {
		t.Fatal(r.err)
	}

	// w1 does not hear of the handoff.
	p.Blackhole()
	if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if pair := lockKeyNow(t, c, name); pair == nil || pair.Session != w1.s.id {
		t.Fatalf("lock key %+v, want handed to w1's session %s", pair, w1.s.id)
	}
	p.Mend()
	t0 := time.Now()
	w1cancel()
	if r := receive(t, w1res, 5*time.Second, "w1"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("w1: %v, %v; want context.Canceled", r.g, r.err)
	}
	r2 := receive(t, w2res, time.Second, "w2")
	if r2.err != nil {
		t.Fatal(r2.err)
	}
	t.Logf("w2 got the lock %v after w1 gave up", time.Since(t0))
	// The tail key names w2's entry (w2 queued last), which stays while w2
	// holds; w2's Unlock deletes both.
	if ks := keys(t, c, name); !slices.Equal(ks, []string{LockKey(name), w2.queueKey(), w2.queueKey() + heldSuffix, name + tailSuffix}) {
		t.Errorf("keys: %q, want the lock key, w2's entry and held mark, and the tail key only", ks)
	}
	if err := r2.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Errorf("keys left: %q", ks)
	}
}

// TestHandoffCancelRace: the head of the queue gives up just as the holder
// hands it the lock, in many interleavings. Either the head returns the grant
// or it leaves nothing, and the next waiter gets the lock within a second.
func TestHandoffCancelRace(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	sx := newSession(t, a.Client(t), WithLockDelay(0))
	s1 := newSession(t, a.Client(t), WithLockDelay(0))
	s2 := newSession(t, a.Client(t), WithLockDelay(0))
	granted := 0
	for i := range 16 {
		name := uniqueName(t)
		x, w1, w2 := newMutex(t, sx, name), newMutex(t, s1, name), newMutex(t, s2, name)
		first := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
		g0, err := first.Lock(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		xres := queueUp(t, c, x, timeout(t, 10*time.Second))
		w1ctx, w1cancel := context.WithCancel(context.Background())
		w1res := queueUp(t, c, w1, w1ctx)
		w2res := queueUp(t, c, w2, timeout(t, 10*time.Second))
		if err := g0.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		r := receive(t, xres, 5*time.Second, "x")
		if r.err != nil {
			t.Fatal(r.err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i%8) * 400 * time.Microsecond)
			w1cancel()
		}()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i/8) * time.Millisecond)
			if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
				t.Error(err)
			}
		}()
		wg.Wait()
		t0 := time.Now()
		r1 := receive(t, w1res, 5*time.Second, "w1")
		switch {
		case r1.err == nil:
			granted++
			if err := r1.g.Unlock(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
		case !errors.Is(r1.err, context.Canceled):
			t.Fatalf("w1: %v", r1.err)
		}
		r2 := receive(t, w2res, time.Second, "w2")
		if r2.err != nil {
			t.Fatal(r2.err)
		}
		if d := time.Since(t0); d > 500*time.Millisecond {
			t.Logf("round %d: w2 in after %v", i, d)
		}
		if err := r2.g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		if ks := keys(t, c, name); len(ks) != 0 {
			t.Errorf("round %d: keys left: %q", i, ks)
		}
		w1cancel()
	}
	t.Logf("w1 returned the grant in %d of 16 rounds, gave up in the others", granted)
}

// TestHandoffHeadSessionDestroyed: the head's session is destroyed before
// the holder unlocks; the handoff fails, Unlock falls back to a plain
// release, and the next live waiter gets the lock.
func TestHandoffHeadSessionDestroyed(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	x := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	s1 := newSession(t, a.Client(t), WithLockDelay(0))
	w1 := newMutex(t, s1, name)
	w2 := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)
	g, res := holderKnowing(t, c, name, x, w1, w2)

	destroy(t, c, s1.ID())
	if r := receive(t, res[0], 5*time.Second, "w1"); !errors.Is(r.err, holdfast.ErrSessionLost) {
		t.Fatalf("w1: %v, want ErrSessionLost", r.err)
	}
	t0 := time.Now()
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatalf("Unlock with the known successor gone: %v", err)
	}
	r := receive(t, res[1], time.Second, "w2")
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("w2 got the lock %v after the Unlock", time.Since(t0))
	if r.g.Token() <= g.Token() {
		t.Errorf("token %d, not above the previous holder's %d", r.g.Token(), g.Token())
	}
	if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Errorf("keys left: %q", ks)
	}
}

// TestHandoffTokensIncrease: with 6 contenders cycling for a second, every
// grant's token is above the one before, and nobody is ever inside with
// anybody else.
func TestHandoffTokensIncrease(t *testing.T) {
	t.Parallel()
	a := agent(t)
	name := uniqueName(t)
	const n = 6
	var (
		last     atomic.Uint64
		inside   atomic.Int32
		acquired atomic.Int64
		wg       sync.WaitGroup
	)
	ctx := timeout(t, 15*time.Second)
	stop := time.Now().Add(time.Second)
	for range n {
		m := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				g, err := m.Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) != 1 {
					t.Error("two holders at once")
				}
				if tok := uint64(g.Token()); tok <= last.Load() {
					t.Errorf("token %d after %d", tok, last.Load())
				} else {
					last.Store(tok)
				}
				acquired.Add(1)
				inside.Add(-1)
				if err := g.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d acquisitions", acquired.Load())
	if ks := keys(t, a.Client(t), name); len(ks) != 0 {
		t.Errorf("keys left: %q", ks)
	}
}

// TestHandoffLeftoverCleanedWhenReachable: the lock is handed to a waiter
// that gives up while its Consul is frozen, so its cleanup cannot run and
// the lock stays with its session. Its Lock returns at once all the same,
// and the session releases the lock as soon as Consul is reachable again,
// so the waiter behind gets it; the same session can lock the name again.
func TestHandoffLeftoverCleanedWhenReachable(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	p, pc := proxied(t, a)
	x := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	s1 := newSession(t, pc, WithLockDelay(0), WithTTL(time.Hour))
	w1 := newMutex(t, s1, name)
	w2 := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)

	first := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	g0, err := first.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	xres := queueUp(t, c, x, timeout(t, 10*time.Second))
	w1ctx, w1cancel := context.WithCancel(context.Background())
	defer w1cancel()
	w1res := queueUp(t, c, w1, w1ctx)
	w2res := queueUp(t, c, w2, timeout(t, 30*time.Second))
	if err := g0.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := receive(t, xres, 5*time.Second, "x")
	if r.err != nil {
		t.Fatal(r.err)
	}
	p.Pause()
	if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if pair := lockKeyNow(t, c, name); pair == nil || pair.Session != s1.ID() {
		t.Fatalf("lock key %+v, want handed to w1's session: the test proves nothing", pair)
	}
	t0 := time.Now()
	w1cancel()
	if r := receive(t, w1res, 5*time.Second, "w1"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("w1: %v, %v; want context.Canceled", r.g, r.err)
	}
	if d := time.Since(t0); d > 100*time.Millisecond {
		t.Errorf("w1's Lock returned %v after its context was cancelled, with Consul frozen; want < 100 ms", d)
	}
	time.Sleep(500 * time.Millisecond)
	if pair := lockKeyNow(t, c, name); pair == nil || pair.Session != s1.ID() {
		t.Fatalf("lock key %+v, want still with w1's session while its Consul is frozen", pair)
	}
	t1 := time.Now()
	p.Mend()
	r2 := receive(t, w2res, cleanupBound, "w2")
	if r2.err != nil {
		t.Fatal(r2.err)
	}
	t.Logf("w2 got the lock %v after w1's Consul was reachable again", time.Since(t1))
	again := lockAsync(w1, timeout(t, 10*time.Second))
	if err := r2.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	r3 := receive(t, again, 5*time.Second, "w1 again")
	if r3.err != nil {
		t.Fatal(r3.err)
	}
	if r3.g.Token() <= r2.g.Token() {
		t.Errorf("token %d, not above the previous holder's %d", r3.g.Token(), r2.g.Token())
	}
	if err := r3.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Errorf("keys left: %q", ks)
	}
}

// TestHandoffSkipsWaiterThatLeft: the holder knows the next waiter, which
// gives up (its session lives on) before the Unlock: the handoff's checks on
// that waiter's queue entry fail, and the lock goes to the waiter behind it,
// not to the session of the one that left.
func TestHandoffSkipsWaiterThatLeft(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	x := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	s1 := newSession(t, a.Client(t), WithLockDelay(0))
	w1 := newMutex(t, s1, name)
	w2 := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)

	release := foreignHolder(t, c, name) // x takes the free lock, reading the queue
	xres := queueUp(t, c, x, timeout(t, 10*time.Second))
	w1ctx, w1cancel := context.WithCancel(context.Background())
	defer w1cancel()
	w1res := queueUp(t, c, w1, w1ctx)
	w2res := queueUp(t, c, w2, timeout(t, 30*time.Second))
	release()
	r := receive(t, xres, 5*time.Second, "x")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if h := r.g.rel.(*acquisition); h.next == nil || h.next.session != s1.ID() {
		t.Fatalf("x's next waiter %+v, want w1's session: the test proves nothing", h.next)
	}
	w1cancel()
	if r := receive(t, w1res, 5*time.Second, "w1"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("w1: %v, want context.Canceled", r.err)
	}
	waitFor(t, 5*time.Second, "w1's queue key removed", func() bool { return !slices.Contains(keys(t, c, name), w1.queueKey()) })
	if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	r2 := receive(t, w2res, time.Second, "w2")
	if r2.err != nil {
		t.Fatal(r2.err)
	}
	if pair := lockKeyNow(t, c, name); pair == nil || pair.Session != w2.s.id {
		t.Errorf("lock key %+v, want held by w2's session", pair)
	}
	if err := r2.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestTailKeyRemoved: the tail key lives only while somebody queues. A
// waiter that gives up as the last in the queue points it back at the live
// waiter ahead of it; a holder handed the lock as the last in the queue
// deletes it when its session closes; nothing is left.
func TestTailKeyRemoved(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	tailKey := name + tailSuffix
	g0, err := newMutex(t, newSession(t, c, WithLockDelay(0)), name).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s1 := newSession(t, a.Client(t), WithLockDelay(0))
	w1 := newMutex(t, s1, name)
	w2 := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)
	w1res := queueUp(t, c, w1, timeout(t, 10*time.Second))
	w2ctx, w2cancel := context.WithCancel(context.Background())
	defer w2cancel()
	w2res := queueUp(t, c, w2, w2ctx)
	if tail, _, err := c.KV().Get(tailKey, nil); err != nil || tail == nil || string(tail.Value) != w2.s.id {
		t.Fatalf("tail key %+v, %v: want w2's session", tail, err)
	}
	w2cancel()
	if r := receive(t, w2res, 5*time.Second, "w2"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("w2: %v, want context.Canceled", r.err)
	}
	waitFor(t, cleanupBound, "the tail key pointed back at w1", func() bool {
		tail, _, err := c.KV().Get(tailKey, nil)
		return err == nil && tail != nil && strings.HasPrefix(string(tail.Value), s1.ID()+" ")
	})
	if err := g0.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := receive(t, w1res, 5*time.Second, "w1")
	if r.err != nil {
		t.Fatal(r.err)
	}
	// w1 holds, handed the lock as the last in the queue; its session ends.
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Errorf("keys left: %q", ks)
	}
}
