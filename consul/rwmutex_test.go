package consul

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

func newRWMutex(t testing.TB, s *Session, name string) *RWMutex {
	t.Helper()
	m, err := NewRWMutex(s, name)
	if err != nil {
		t.Fatalf("NewRWMutex(%q): %v", name, err)
	}
	return m
}

// acquireAsync starts f and returns a channel with its grant (nil on error).
func acquireAsync(t *testing.T, f func(context.Context) (*Grant, error), ctx context.Context) <-chan *Grant {
	ch := make(chan *Grant, 1)
	go func() {
		g, err := f(ctx)
		if err != nil && ctx.Err() == nil {
			t.Error(err)
		}
		ch <- g
	}()
	return ch
}

// blocked fails the test if ch yields within d.
func blocked(t *testing.T, ch <-chan *Grant, d time.Duration, what string) {
	t.Helper()
	select {
	case g := <-ch:
		t.Fatalf("%s got the lock (%v)", what, g != nil)
	case <-time.After(d):
	}
}

// granted waits up to d for ch's grant.
func granted(t *testing.T, ch <-chan *Grant, d time.Duration, what string) *Grant {
	t.Helper()
	select {
	case g := <-ch:
		if g == nil {
			t.Fatalf("%s failed", what)
		}
		return g
	case <-time.After(d):
		t.Fatalf("%s not granted within %v", what, d)
	}
	return nil
}

// TestRWMutexExclusion: readers and writers on many sessions; a writer is
// never beside anyone (counted in-process, and fenced: every writer bumps a
// counter read by nobody else meanwhile), and readers do share.
func TestRWMutexExclusion(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 60*time.Second)
	var readers, writers, peakReaders, bad atomic.Int64
	var lastWrite atomic.Uint64
	var fence holdfast.Fence // what writers write to: it refuses stale tokens
	data := 0
	var wg sync.WaitGroup
	for i := range 8 {
		m := newRWMutex(t, newSession(t, c), name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 1))
			for range 12 {
				if r.IntN(3) == 0 {
					g, err := m.Lock(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					if writers.Add(1) != 1 || readers.Load() != 0 {
						bad.Add(1)
					}
					if err := fence.Do(g.Token(), func() { data++ }); err != nil || g.Token() == fence.Max() && uint64(g.Token()) == lastWrite.Load() {
						t.Errorf("write token %d refused by the fence (or reused): %v", g.Token(), err)
					}
					lastWrite.Store(uint64(g.Token()))
					time.Sleep(3 * time.Millisecond)
					writers.Add(-1)
					if err := g.Unlock(ctx); err != nil {
						t.Error(err)
					}
					continue
				}
				g, err := m.RLock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				n := readers.Add(1)
				for p := peakReaders.Load(); n > p && !peakReaders.CompareAndSwap(p, n); p = peakReaders.Load() {
				}
				if writers.Load() != 0 {
					bad.Add(1)
				}
				if uint64(g.Token()) <= lastWrite.Load() {
					t.Errorf("read token %d not after the last write's %d", g.Token(), lastWrite.Load())
				}
				time.Sleep(5 * time.Millisecond)
				readers.Add(-1)
				if err := g.Unlock(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d moments with a writer beside someone", bad.Load())
	}
	t.Logf("up to %d readers at once", peakReaders.Load())
	if peakReaders.Load() < 2 {
		t.Errorf("readers never shared")
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// TestRWMutexFIFO: a reader behind a queued writer waits; the writer gets
// the lock when the readers before it are gone, and the reader after it.
func TestRWMutexFIFO(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 30*time.Second)
	r1, err := newRWMutex(t, newSession(t, c), name).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r1b, err := newRWMutex(t, newSession(t, c), name).RLock(ctx) // readers share
	if err != nil {
		t.Fatal(err)
	}
	w := acquireAsync(t, newRWMutex(t, newSession(t, c), name).Lock, ctx)
	waitFor(t, 5*time.Second, "the writer queued", func() bool { return len(keys(t, c, name)) == 4 })
	late := newRWMutex(t, newSession(t, c), name)
	if _, err := late.TryRLock(ctx); !errors.Is(err, holdfast.ErrLocked) {
		t.Fatalf("TryRLock behind a queued writer: %v, want ErrLocked", err)
	}
	r2 := acquireAsync(t, late.RLock, ctx)
	blocked(t, w, 300*time.Millisecond, "the writer, beside two readers,")
	blocked(t, r2, 10*time.Millisecond, "a reader behind a queued writer")
	_ = r1.Unlock(ctx)
	blocked(t, w, 200*time.Millisecond, "the writer, beside a reader,")
	_ = r1b.Unlock(ctx)
	wg := granted(t, w, 3*time.Second, "the writer")
	blocked(t, r2, 300*time.Millisecond, "a reader beside a writer")
	_ = wg.Unlock(ctx)
	rg := granted(t, r2, 3*time.Second, "the reader after the writer")
	if rg.Token() <= wg.Token() {
		t.Errorf("read token %d after write token %d", rg.Token(), wg.Token())
	}
	_ = rg.Unlock(ctx)
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// TestRWMutexDowngrade: a write grant becomes a read grant with no moment
// where a queued writer could get in; the readers queued at the head join
// it, the writer queued after them still waits, and the reader behind that
// writer too.
func TestRWMutexDowngrade(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 30*time.Second)
	m := newRWMutex(t, newSession(t, c), name)
	wgr, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2 := acquireAsync(t, newRWMutex(t, newSession(t, c), name).RLock, ctx)
	waitFor(t, 5*time.Second, "reader queued", func() bool { return len(keys(t, c, name)) == 3 })
	w3 := acquireAsync(t, newRWMutex(t, newSession(t, c), name).Lock, ctx)
	waitFor(t, 5*time.Second, "writer queued", func() bool { return len(keys(t, c, name)) == 4 })
	r4 := acquireAsync(t, newRWMutex(t, newSession(t, c), name).RLock, ctx)
	waitFor(t, 5*time.Second, "reader queued", func() bool { return len(keys(t, c, name)) == 5 })

	rd, err := m.Downgrade(ctx, wgr)
	if err != nil {
		t.Fatal(err)
	}
	if rd.Token() != wgr.Token() || rd.Key() != wgr.Key() {
		t.Errorf("read grant %s %d, write grant %s %d: want the same key and token", rd.Key(), rd.Token(), wgr.Key(), wgr.Token())
	}
	if !errors.Is(context.Cause(wgr.Context()), holdfast.ErrReleased) {
		t.Errorf("the write grant's context: %v", context.Cause(wgr.Context()))
	}
	if rd.Context().Err() != nil {
		t.Fatal("the read grant is not held")
	}
	if err := wgr.Unlock(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Unlock of the downgraded write grant: %v", err)
	}
	if _, err := m.Downgrade(ctx, rd); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Downgrade of a read grant: %v", err)
	}
	g2 := granted(t, r2, 3*time.Second, "the reader queued at the head")
	blocked(t, w3, 300*time.Millisecond, "the writer, beside the downgraded reader,")
	blocked(t, r4, 10*time.Millisecond, "the reader behind the writer")
	st, err := decodeRWLock(mustGet(t, c, name+"/.lock").Value, 0)
	if err != nil || len(st.holders) != 2 {
		t.Fatalf("holders %v, %v", st.holders, err)
	}
	_ = rd.Unlock(ctx)
	_ = g2.Unlock(ctx)
	g3 := granted(t, w3, 3*time.Second, "the writer")
	if g3.Token() <= rd.Token() {
		t.Errorf("write token %d after read token %d", g3.Token(), rd.Token())
	}
	_ = g3.Unlock(ctx)
	_ = granted(t, r4, 3*time.Second, "the last reader").Unlock(ctx)
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

func mustGet(t testing.TB, c *api.Client, key string) *api.KVPair {
	t.Helper()
	pair, _, err := c.KV().Get(key, nil)
	if err != nil || pair == nil {
		t.Fatalf("get %s: %v %v", key, pair, err)
	}
	return pair
}

// TestRWMutexCancelLeavesNothing: RLock and Lock given up while a writer
// holds leave nothing; TryLock and TryRLock write nothing.
func TestRWMutexCancelLeavesNothing(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 30*time.Second)
	g, err := newRWMutex(t, newSession(t, c), name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := keys(t, c, name)
	m := newRWMutex(t, newSession(t, c), name)
	for _, f := range []func(context.Context) (*Grant, error){m.RLock, m.Lock} {
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := f(wctx)
		cancel()
		if !isCtx(err) {
			t.Fatalf("while a writer holds: %v", err)
		}
		waitFor(t, cleanupBound, "the cancelled call's key removed", func() bool { return len(keys(t, c, name)) == len(before) })
	}
	for _, f := range []func(context.Context) (*Grant, error){m.TryRLock, m.TryLock} {
		if _, err := f(ctx); !errors.Is(err, holdfast.ErrLocked) {
			t.Fatalf("try while a writer holds: %v", err)
		}
		if after := keys(t, c, name); len(after) != len(before) {
			t.Fatalf("keys %v, after a try %v", before, after)
		}
	}
	_ = g.Unlock(ctx)
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// TestRWMutexLoss: a reader whose session is destroyed is told at once,
// stops being counted, and a writer gets the lock.
func TestRWMutexLoss(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 30*time.Second)
	s1 := newSession(t, c, WithLockDelay(0))
	r, err := newRWMutex(t, s1, name).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := acquireAsync(t, newRWMutex(t, newSession(t, c), name).Lock, ctx)
	waitFor(t, 5*time.Second, "writer queued", func() bool { return len(keys(t, c, name)) == 3 })
	destroy(t, c, s1.ID())
	select {
	case <-r.Context().Done():
		if !errors.Is(context.Cause(r.Context()), holdfast.ErrSessionLost) {
			t.Errorf("cause %v", context.Cause(r.Context()))
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the reader was not told")
	}
	g := granted(t, w, blockWait+5*time.Second, "the writer after the reader's session ended")
	if g.Token() <= r.Token() {
		t.Errorf("token %d after %d", g.Token(), r.Token())
	}
	_ = g.Unlock(ctx)
}

// TestRWMutexConflict: an RWMutex and a Mutex, Semaphore or api.Lock on the
// same name exclude each other with errors, whoever comes second.
func TestRWMutexConflict(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	ctx := timeout(t, 30*time.Second)
	s := newSession(t, c)
	name := uniqueName(t)
	g, err := newRWMutex(t, s, name).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s2 := newSession(t, c)
	if _, err := newMutex(t, s2, name).Lock(ctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Errorf("Mutex on an RWMutex's name: %v", err)
	}
	if _, err := newSemaphore(t, s2, name, 2).Lock(ctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Errorf("Semaphore on an RWMutex's name: %v", err)
	}
	l, err := c.LockOpts(&api.LockOptions{Key: name + "/.lock", LockTryOnce: true, LockWaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(nil); !errors.Is(err, api.ErrLockConflict) {
		t.Errorf("api.Lock on an RWMutex's name: %v", err)
	}
	_ = g.Unlock(ctx)

	name = uniqueName(t)
	p, err := newSemaphore(t, s, name, 3).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newRWMutex(t, s2, name).RLock(ctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Errorf("RWMutex on a Semaphore's name: %v", err)
	}
	_ = p.Unlock(ctx)
	name = uniqueName(t)
	mg, err := newMutex(t, s, name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newRWMutex(t, s2, name).Lock(ctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Errorf("RWMutex on a Mutex's name: %v", err)
	}
	_ = mg.Unlock(ctx)
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// TestRWMutexChurn: readers and writers that give up at random moments
// never strand the lock (no successful wait as long as the 5 s re-read),
// a writer is never beside anyone, and nothing is left.
func TestRWMutexChurn(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 90*time.Second)
	var readers, writers, bad, slowest atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		m := newRWMutex(t, newSession(t, c), name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 3))
			for range 15 {
				write := r.IntN(3) == 0
				f := m.RLock
				if write {
					f = m.Lock
				}
				if r.IntN(4) == 0 {
					cctx, cancel := context.WithTimeout(ctx, time.Duration(r.IntN(20))*time.Millisecond)
					g, err := f(cctx)
					cancel()
					if err == nil {
						_ = g.Unlock(ctx)
					}
					continue
				}
				start := time.Now()
				g, err := f(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if d := int64(time.Since(start)); d > slowest.Load() {
					slowest.Store(d)
				}
				if write {
					if writers.Add(1) != 1 || readers.Load() != 0 {
						bad.Add(1)
					}
				} else if readers.Add(1); writers.Load() != 0 {
					bad.Add(1)
				}
				time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
				if write {
					writers.Add(-1)
				} else {
					readers.Add(-1)
				}
				if err := g.Unlock(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("slowest wait %v", time.Duration(slowest.Load()))
	if bad.Load() != 0 {
		t.Fatalf("%d moments with a writer beside someone", bad.Load())
	}
	if time.Duration(slowest.Load()) > 4*time.Second {
		t.Errorf("a wait of %v: the lock was stranded until a re-read", time.Duration(slowest.Load()))
	}
	leftNothing(t, c, name)
}

// TestPermitToldBeforeNextGrant: a write holder cut off from Consul (its
// session then expires by TTL) is told, by its grant's context, before a
// reader waiting on another session gets the lock; the same holds for a
// semaphore's permit, since both stop counting a holder only once Consul has
// invalidated its session.
func TestPermitToldBeforeNextGrant(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	p, pc := proxied(t, a)
	name := uniqueName(t)
	ctx := timeout(t, 60*time.Second)
	cut := newSession(t, pc, WithTTL(MinTTL), WithLockDelay(0))
	w, err := newRWMutex(t, cut, name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := acquireAsync(t, newRWMutex(t, newSession(t, c), name).RLock, ctx)
	waitFor(t, 5*time.Second, "reader queued", func() bool { return len(keys(t, c, name)) == 3 })
	p.Blackhole()
	var told time.Time
	select {
	case <-w.Context().Done():
		told = time.Now()
	case <-time.After(2*MinTTL + 5*time.Second):
		t.Fatal("the cut-off writer was never told")
	}
	g := granted(t, r, 2*MinTTL+blockWait+5*time.Second, "the reader")
	got := time.Now()
	t.Logf("writer told %v before the reader got the lock", got.Sub(told))
	if !told.Before(got) {
		t.Fatalf("the reader got the lock %v before the writer was told", told.Sub(got))
	}
	_ = g.Unlock(ctx)
}
