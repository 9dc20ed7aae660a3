package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"
	"google.golang.org/grpc"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

func newRWMutex(t *testing.T, s *etcd.Session, name string) *etcd.RWMutex {
	t.Helper()
	rw, err := etcd.NewRWMutex(s, name)
	if err != nil {
		t.Fatal(err)
	}
	return rw
}

// Readers share, a writer excludes everyone: checked by counters updated
// only while a grant holds (each holder also writes through its guarded
// Txn), with many readers seen together.
func TestRWMutexExclusionFenced(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	const workers, rounds = 8, 8
	name := "rw/fenced"
	var readers, writers, mostReaders, writes atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		rw := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				write := rand.IntN(3) == 0
				lock := rw.RLock
				if write {
					lock = rw.Lock
				}
				g, err := lock(ctx)
				if err != nil {
					errs <- err
					return
				}
				if write {
					if writers.Add(1) != 1 || readers.Load() != 0 {
						errs <- fmt.Errorf("a writer beside %d writers and %d readers", writers.Load()-1, readers.Load())
					}
					writes.Add(1)
				} else {
					n := readers.Add(1)
					for m := mostReaders.Load(); n > m && !mostReaders.CompareAndSwap(m, n); m = mostReaders.Load() {
					}
					if writers.Load() != 0 {
						errs <- errors.New("a reader beside a writer")
					}
				}
				if _, err := g.Txn(ctx, clientv3.OpPut(fmt.Sprintf("rw-data/%d", w), fmt.Sprint(r))); err != nil {
					errs <- err
					return
				}
				time.Sleep(2 * time.Millisecond)
				if write {
					writers.Add(-1)
				} else {
					readers.Add(-1)
				}
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
	t.Logf("%d writes; most readers at once %d", writes.Load(), mostReaders.Load())
	if mostReaders.Load() < 2 {
		t.Fatalf("readers never shared the lock (most at once %d)", mostReaders.Load())
	}
	if ks := keys(t, cli, name+"/"); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// FIFO: a reader behind a queued writer waits (no writer starvation);
// layout and tokens; each handoff is prompt.
func TestRWMutexFIFO(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	name := "rw/fifo"
	s1 := newSession(t, c, etcd.WithTTL(5*time.Second))
	r1, err := newRWMutex(t, s1, name).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s/read/%x", name, int64(s1.Lease())); r1.Key() != want {
		t.Fatalf("read key %q, want %q", r1.Key(), want)
	}
	r2, err := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name).RLock(ctx)
	if err != nil {
		t.Fatal(err) // readers share
	}
	ws := newSession(t, c, etcd.WithTTL(5*time.Second))
	w := lockAsync(ctx, newRWMutex(t, ws, name).Lock)
	waitQueued(t, cli, name, 3)
	late := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name)
	if _, err := late.TryRLock(ctx); !errors.Is(err, holdfast.ErrLocked) {
		t.Fatalf("TryRLock behind a queued writer: %v, want ErrLocked", err)
	}
	r3 := lockAsync(ctx, late.RLock)
	waitQueued(t, cli, name, 4)
	waiting(t, r3, 100*time.Millisecond, "reader behind a queued writer")
	if err := r1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waiting(t, w, 50*time.Millisecond, "writer while a reader holds")
	start := time.Now()
	if err := r2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg := granted(t, w, 2*time.Second, "writer")
	within(t, "reader-to-writer handoff", time.Since(start), 250*time.Millisecond) // prompt on a loaded 2-core box (measured 4-6 ms when idle)
	if want := fmt.Sprintf("%s/write/%x", name, int64(ws.Lease())); wg.Key() != want {
		t.Fatalf("write key %q, want %q", wg.Key(), want)
	}
	if wg.Token() <= r2.Token() {
		t.Fatalf("writer token %d not above the readers' (%d)", wg.Token(), r2.Token())
	}
	waiting(t, r3, 50*time.Millisecond, "reader while a writer holds")
	start = time.Now()
	if err := wg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g3 := granted(t, r3, 2*time.Second, "reader behind the writer")
	within(t, "writer-to-reader handoff", time.Since(start), 250*time.Millisecond)
	if g3.Token() <= wg.Token() {
		t.Fatalf("reader token %d not above the writer's before it (%d)", g3.Token(), wg.Token())
	}
	if err := g3.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, cli, name+"/"); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// Downgrade lets the readers queued behind the writer in, but not a queued
// writer (nor the readers behind that writer); the read grant keeps the
// write grant's key and token, and the write grant ends with ErrReleased
// (the etcd/rw-downgrade-in-place guard).
func TestRWMutexDowngrade(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	name := "rw/downgrade"
	rw := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name)
	wg, err := rw.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r1 := lockAsync(ctx, newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name).RLock)
	waitQueued(t, cli, name, 2)
	w2 := lockAsync(ctx, newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name).Lock)
	waitQueued(t, cli, name, 3)
	r2 := lockAsync(ctx, newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name).RLock)
	waitQueued(t, cli, name, 4)
	waiting(t, r1, 50*time.Millisecond, "reader while the writer holds")

	start := time.Now()
	dg, err := rw.Downgrade(ctx, wg)
	if err != nil {
		t.Fatal(err)
	}
	g1 := granted(t, r1, 2*time.Second, "reader queued behind the downgraded writer")
	within(t, "downgrade to reader admitted", time.Since(start), 100*time.Millisecond)
	waiting(t, w2, 300*time.Millisecond, "writer queued behind the downgraded writer")
	waiting(t, r2, 10*time.Millisecond, "reader queued behind the second writer")
	if dg.Key() != wg.Key() || dg.Token() != wg.Token() {
		t.Fatalf("read grant %s token %d, want the write grant's %s token %d", dg.Key(), dg.Token(), wg.Key(), wg.Token())
	}
	if !errors.Is(context.Cause(wg.Context()), holdfast.ErrReleased) {
		t.Fatalf("write grant cause %v, want ErrReleased", context.Cause(wg.Context()))
	}
	if err := wg.Unlock(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("Unlock of the downgraded write grant: %v, want ErrNotHeld", err)
	}
	if _, err := dg.Txn(ctx, clientv3.OpPut("rw-downgrade-data", "x")); err != nil {
		t.Fatalf("guarded Txn of the read grant: %v", err)
	}
	if err := dg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waiting(t, w2, 100*time.Millisecond, "writer while a reader still holds")
	if err := g1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g2 := granted(t, w2, 2*time.Second, "second writer")
	if g2.Token() <= dg.Token() {
		t.Fatalf("second writer's token %d not above the first's %d", g2.Token(), dg.Token())
	}
	if err := g2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g3 := granted(t, r2, 2*time.Second, "last reader")
	if err := g3.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, cli, name+"/"); len(ks) != 0 {
		t.Fatalf("keys left (the marker?): %v", ks)
	}
	// The session can take the name again (the slot went to the read grant
	// and back).
	wg, err = rw.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := wg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A writer queued right behind a downgraded writer keeps waiting: a new
// read key in place of the write key would be newer than that writer, which
// would stop waiting for it (the etcd/rw-downgrade-in-place guard).
func TestRWMutexDowngradeKeepsWriterWaiting(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	name := "rw/downgrade-writer"
	rw := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name)
	wg, err := rw.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w3 := lockAsync(ctx, newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name).Lock)
	waitQueued(t, cli, name, 2)
	dg, err := rw.Downgrade(ctx, wg)
	if err != nil {
		t.Fatal(err)
	}
	waiting(t, w3, 300*time.Millisecond, "writer queued right behind the downgraded writer")
	if err := dg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g4 := granted(t, w3, 2*time.Second, "writer after the read grant")
	if err := g4.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A marker left behind (its write key gone) does not let a reader in beside
// a writer: readers discount only the write key the marker names (the
// etcd/rw-marker-check guard).
func TestRWMutexStaleMarker(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	name := "rw/stale-marker"
	wg, err := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, name+"/.down", name+"/write/1234 5"); err != nil {
		t.Fatal(err)
	}
	rw := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name)
	if g, err := rw.TryRLock(ctx); !errors.Is(err, holdfast.ErrLocked) {
		if err == nil {
			_ = g.Unlock(ctx)
		}
		t.Fatalf("TryRLock beside a writer with a stale marker: %v, want ErrLocked", err)
	}
	r := lockAsync(ctx, rw.RLock)
	waiting(t, r, 300*time.Millisecond, "reader beside a writer with a stale marker")
	if _, err := cli.Delete(ctx, name+"/.down"); err != nil {
		t.Fatal(err)
	}
	if err := wg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g := granted(t, r, 2*time.Second, "reader after the writer")
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Interop with etcd's recipe.RWMutex on the same name: the same key layout,
// so they exclude each other; a holdfast downgrade lets holdfast readers in,
// while the recipe's reader (which does not know the marker) and writer
// (which orders keys by mod revision, which the downgrade leaves alone)
// keep waiting.
func TestRWMutexRecipeInterop(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	name := "rw/interop"
	ns, err := concurrency.NewSession(c.Client(t), concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	native := recipe.NewRWMutex(ns, name)
	nativeAsync := func(lock func() error) <-chan error {
		ch := make(chan error, 1)
		go func() { ch <- lock() }()
		return ch
	}
	expect := func(ch <-chan error, d time.Duration, what string) {
		t.Helper()
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(d):
			t.Fatalf("%s: not granted within %v", what, d)
		}
	}
	blocked := func(ch <-chan error, d time.Duration, what string) {
		t.Helper()
		select {
		case err := <-ch:
			t.Fatalf("%s: returned (%v), want it to wait", what, err)
		case <-time.After(d):
		}
	}

	// A native writer excludes holdfast readers and writers.
	if err := native.Lock(); err != nil {
		t.Fatal(err)
	}
	rw := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name)
	if _, err := rw.TryRLock(ctx); !errors.Is(err, holdfast.ErrLocked) {
		t.Fatalf("TryRLock while the recipe writes: %v", err)
	}
	r := lockAsync(ctx, rw.RLock)
	waiting(t, r, 100*time.Millisecond, "holdfast reader while the recipe writes")
	if err := native.Unlock(); err != nil {
		t.Fatal(err)
	}
	rg := granted(t, r, 2*time.Second, "holdfast reader after the recipe's writer")
	// Readers of both share.
	expect(nativeAsync(native.RLock), 2*time.Second, "recipe reader beside a holdfast reader")
	if err := native.RUnlock(); err != nil {
		t.Fatal(err)
	}
	// A holdfast reader excludes a native writer.
	nw := nativeAsync(native.Lock)
	blocked(nw, 100*time.Millisecond, "recipe writer while holdfast reads")
	if err := rg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	expect(nw, 2*time.Second, "recipe writer after the holdfast reader")
	if err := native.Unlock(); err != nil {
		t.Fatal(err)
	}

	// Downgrade with recipe contenders queued: holdfast writer W, recipe
	// reader, holdfast reader, recipe writer.
	wrw := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name)
	wg, err := wrw.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ns2, err := concurrency.NewSession(c.Client(t), concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns2.Close() })
	nativeR := recipe.NewRWMutex(ns2, name)
	nr := nativeAsync(nativeR.RLock)
	waitQueued(t, cli, name, 2)
	hr := lockAsync(ctx, rw.RLock)
	waitQueued(t, cli, name, 3)
	nw = nativeAsync(native.Lock)
	waitQueued(t, cli, name, 4)
	dg, err := wrw.Downgrade(ctx, wg)
	if err != nil {
		t.Fatal(err)
	}
	hg := granted(t, hr, 2*time.Second, "holdfast reader behind the downgraded writer")
	blocked(nr, 200*time.Millisecond, "recipe reader behind the downgraded writer (it sees a write key)")
	blocked(nw, 10*time.Millisecond, "recipe writer behind the downgraded writer")
	if err := dg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	expect(nr, 2*time.Second, "recipe reader after the downgraded grant")
	if err := hg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	blocked(nw, 100*time.Millisecond, "recipe writer while the recipe reader holds")
	if err := nativeR.RUnlock(); err != nil {
		t.Fatal(err)
	}
	expect(nw, 2*time.Second, "recipe writer last")
	if err := native.Unlock(); err != nil {
		t.Fatal(err)
	}

	// The recipe's writer orders keys by mod revision: a downgrade that
	// rewrote the write key would let it in beside the read grant once the
	// holdfast reader between them leaves (the etcd/rw-write-key-untouched
	// guard).
	wg, err = wrw.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hr = lockAsync(ctx, rw.RLock)
	waitQueued(t, cli, name, 2)
	nw = nativeAsync(native.Lock)
	waitQueued(t, cli, name, 3)
	if dg, err = wrw.Downgrade(ctx, wg); err != nil {
		t.Fatal(err)
	}
	hg = granted(t, hr, 2*time.Second, "holdfast reader behind the downgraded writer")
	if err := hg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	blocked(nw, 300*time.Millisecond, "recipe writer while the downgraded grant reads")
	if err := dg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	expect(nw, 2*time.Second, "recipe writer after the downgraded grant")
	if err := native.Unlock(); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, cli, name+"/"); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// Cancelling a waiting RLock or Lock returns at once and leaves no key.
func TestRWMutexCancelWaiting(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	name := "rw/cancel"
	wg, err := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rw := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name)
	for what, lock := range map[string]func(context.Context) (*etcd.Grant, error){"RLock": rw.RLock, "Lock": rw.Lock} {
		cctx, cancel := context.WithCancel(ctx)
		ch := lockAsync(cctx, lock)
		waitQueued(t, cli, name, 2)
		start := time.Now()
		cancel()
		select {
		case r := <-ch:
			if !errors.Is(r.err, context.Canceled) {
				t.Fatalf("cancelled %s: %v", what, r.err)
			}
		case <-time.After(time.Second):
			t.Fatalf("cancelled %s still waiting", what)
		}
		within(t, "cancelled "+what, time.Since(start), 100*time.Millisecond)
		waitFor(t, 2*time.Second, what+" key removed", func() bool { return len(keys(t, cli, name+"/")) == 1 })
	}
	if wg.Context().Err() != nil {
		t.Fatal("holder affected by a waiter's cancel")
	}
	if err := wg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A revoked holder is told within milliseconds (ErrLost), and the writer
// waiting behind it is admitted.
func TestRWMutexLossNotice(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	name := "rw/loss"
	hs := newSession(t, c, etcd.WithTTL(5*time.Second))
	rg, err := newRWMutex(t, hs, name).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := lockAsync(ctx, newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name).Lock)
	waitQueued(t, cli, name, 2)
	time.Sleep(50 * time.Millisecond) // the session watches the grant's key
	start := time.Now()
	if _, err := cli.Revoke(ctx, hs.Lease()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rg.Context().Done():
	case <-time.After(2 * time.Second):
		t.Fatal("revoked reader not told")
	}
	within(t, "loss notice", time.Since(start), 300*time.Millisecond)
	if !errors.Is(context.Cause(rg.Context()), holdfast.ErrLost) {
		t.Fatalf("cause %v, want ErrLost", context.Cause(rg.Context()))
	}
	g := granted(t, w, 2*time.Second, "writer after the revoked reader")
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A RWMutex and a Mutex or Semaphore of the same name: whoever comes second
// fails with ErrConflict, and what it wrote is removed.
func TestRWMutexConflicts(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	sess := func() *etcd.Session { return newSession(t, c, etcd.WithTTL(5*time.Second)) }

	mg, err := newMutex(t, sess(), "rw/c1").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sg, err := newSemaphore(t, sess(), "rw/c2", 2).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rw/c1", "rw/c2"} {
		for _, what := range []string{"Lock", "RLock", "TryLock", "TryRLock"} {
			rw := newRWMutex(t, sess(), name) // a session each: a failed Lock's cleanup holds its session's name
			lock := map[string]func(context.Context) (*etcd.Grant, error){"Lock": rw.Lock, "RLock": rw.RLock, "TryLock": rw.TryLock, "TryRLock": rw.TryRLock}[what]
			if _, err := lock(ctx); !errors.Is(err, holdfast.ErrConflict) {
				t.Fatalf("%s on %s: %v, want ErrConflict", what, name, err)
			}
		}
	}
	waitFor(t, 2*time.Second, "the RW keys removed", func() bool {
		return len(keys(t, cli, "rw/c1/")) == 1 && len(keys(t, cli, "rw/c2/")) == 1
	})
	for _, g := range []*etcd.Grant{mg, sg} {
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}

	rg, err := newRWMutex(t, sess(), "rw/c3").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newMutex(t, sess(), "rw/c3").Lock(ctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Fatalf("mutex on a read-locked name: %v, want ErrConflict", err)
	}
	sem := newSemaphore(t, sess(), "rw/c3", 2)
	if _, err := sem.Lock(ctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Fatalf("semaphore Lock on a read-locked name: %v, want ErrConflict", err)
	}
	if _, err := sem.TryLock(ctx); !errors.Is(err, holdfast.ErrConflict) {
		t.Fatalf("semaphore TryLock on a read-locked name: %v, want ErrConflict", err)
	}
	waitFor(t, 2*time.Second, "the mutex key removed", func() bool { return len(keys(t, cli, "rw/c3/")) == 1 })
	if err := rg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Bad input: ErrInvalidArgument before any request; Downgrade only of a
// held write grant of the same lock.
func TestRWMutexBadInput(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	s := newSession(t, c, etcd.WithTTL(5*time.Second))
	if _, err := etcd.NewRWMutex(nil, "x"); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("nil session: %v", err)
	}
	if _, err := etcd.NewRWMutex(s, "a//b"); !errors.Is(err, holdfast.ErrInvalidName) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := etcd.NewRWMutex(s, "x", holdfast.WithReentrant()); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("reentrant: %v", err)
	}
	rw := newRWMutex(t, s, "rw/bad")
	for what, lock := range map[string]func(context.Context) (*etcd.Grant, error){"Lock": rw.Lock, "RLock": rw.RLock, "TryLock": rw.TryLock, "TryRLock": rw.TryRLock} {
		if _, err := lock(nil); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("%s(nil): %v", what, err)
		}
	}
	rg, err := rw.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Downgrade(ctx, rg); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Downgrade of a read grant: %v", err)
	}
	if _, err := rw.Downgrade(ctx, nil); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Downgrade(nil): %v", err)
	}
	if err := rg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg, err := rw.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1012 checks that a nil context is refused, not a panic
	if _, err := rw.Downgrade(nil, wg); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Downgrade(nil ctx): %v", err)
	}
	other := newRWMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), "rw/bad")
	if _, err := other.Downgrade(ctx, wg); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Downgrade through another RWMutex: %v", err)
	}
	if err := wg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Downgrade(ctx, wg); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Downgrade of a released grant: %v, want ErrNotHeld", err)
	}
}

// With the store frozen, Semaphore.Lock, RWMutex.RLock and Downgrade honour
// their contexts, and what they left is removed once the store is back.
func TestCountingFrozenStore(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	bounded := func(t *testing.T, what string, f func(context.Context) error) {
		t.Helper()
		fctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := f(fctx)
		within(t, what+" on a frozen store", time.Since(start), 500*time.Millisecond)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: %v, want DeadlineExceeded", what, err)
		}
	}
	hg, err := newSemaphore(t, newSession(t, c, etcd.WithTTL(10*time.Second)), "frozen/sem", 1).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wg, err := newRWMutex(t, newSession(t, c, etcd.WithTTL(10*time.Second)), "frozen/rw").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, p := proxiedSession(t, c, etcd.WithTTL(10*time.Second))
	sem := newSemaphore(t, s, "frozen/sem", 1)
	rw := newRWMutex(t, s, "frozen/rw")

	// Frozen before the call: no watch can be created, nothing is written.
	p.Pause()
	bounded(t, "Semaphore.Lock", func(ctx context.Context) error { _, err := sem.Lock(ctx); return err })
	bounded(t, "RWMutex.RLock", func(ctx context.Context) error { _, err := rw.RLock(ctx); return err })
	p.Mend()

	// Frozen while waiting.
	for _, tc := range []struct {
		name string
		lock func(context.Context) (*etcd.Grant, error)
	}{{"frozen/sem", sem.Lock}, {"frozen/rw", rw.RLock}} {
		lctx, cancel := context.WithCancel(ctx)
		ch := lockAsync(lctx, tc.lock)
		waitQueued(t, cli, tc.name, 2)
		p.Pause()
		start := time.Now()
		cancel()
		if r := <-ch; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("%s: %v", tc.name, r.err)
		}
		within(t, tc.name+" cancelled on a frozen store", time.Since(start), 100*time.Millisecond)
		p.Mend()
		waitFor(t, 3*time.Second, tc.name+" waiter key removed", func() bool { return len(keys(t, cli, tc.name+"/")) == 1 })
	}
	if err := hg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Downgrade on a frozen store: bounded; the write grant has ended, and
	// the key (and the marker, if it landed) are removed once the store is
	// back, after which the session can take the name again.
	w, err := rw.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.Pause()
	bounded(t, "Downgrade", func(ctx context.Context) error { _, err := rw.Downgrade(ctx, w); return err })
	if !errors.Is(context.Cause(w.Context()), holdfast.ErrReleased) {
		t.Fatalf("write grant after a failed downgrade: %v", context.Cause(w.Context()))
	}
	p.Mend()
	waitFor(t, 3*time.Second, "keys removed after the failed downgrade", func() bool { return len(keys(t, cli, "frozen/rw/")) == 0 })
	waitFor(t, time.Second, "TryLock through the same session", func() bool {
		g, err := rw.TryLock(ctx)
		return err == nil && g.Unlock(ctx) == nil
	})
}

// Churn on 3 members: readers and writers on different members, some giving
// up while they wait, some writers downgrading; never a writer beside
// anyone (counted in-process), and every key gone at the end.
func TestRWMutexChurnThreeMembers(t *testing.T) {
	t.Parallel() // its own etcd, and mostly waiting: beside the other long tests
	c := etcdtest.EtcdCluster(t, 3)
	admin := c.Client(t)
	ctx := context.Background()
	const name, workers, rounds = "rw/churn", 8, 8
	var readers, writers, mostReaders, downgrades, gaveUp atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		cli := c.Client(t, func(cfg *clientv3.Config) { cfg.Endpoints = []string{c.Endpoint(w % 3)} })
		s, err := etcd.NewSession(ctx, cli, etcd.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		rw := newRWMutex(t, s, name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				write := rand.IntN(2) == 0
				lock := rw.RLock
				if write {
					lock = rw.Lock
				}
				lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				if rand.IntN(4) == 0 {
					cancel()
					lctx, cancel = context.WithTimeout(ctx, time.Duration(5+rand.IntN(30))*time.Millisecond)
				}
				g, err := lock(lctx)
				cancel()
				if err != nil {
					gaveUp.Add(1)
					if !errors.Is(err, context.DeadlineExceeded) {
						errs <- err
					}
					continue
				}
				enterRead := func(check bool) {
					n := readers.Add(1)
					for m := mostReaders.Load(); n > m && !mostReaders.CompareAndSwap(m, n); m = mostReaders.Load() {
					}
					if check && writers.Load() != 0 {
						errs <- errors.New("a reader beside a writer")
					}
				}
				if write {
					if writers.Add(1) != 1 || readers.Load() != 0 {
						errs <- fmt.Errorf("a writer beside %d writers and %d readers", writers.Load()-1, readers.Load())
					}
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
					if rand.IntN(2) == 0 {
						// Count ourselves as a reader before the downgrade
						// lands, so that a reader let in is never seen
						// beside our writer count.
						enterRead(false) // we are the writer
						writers.Add(-1)
						dg, err := rw.Downgrade(ctx, g)
						if err != nil {
							errs <- err
							readers.Add(-1)
							continue
						}
						downgrades.Add(1)
						g, write = dg, false
					} else {
						writers.Add(-1)
					}
				} else {
					enterRead(true)
				}
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				if !write {
					readers.Add(-1)
				}
				if err := g.Unlock(ctx); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d downgrades, %d gave up, most readers at once %d", downgrades.Load(), gaveUp.Load(), mostReaders.Load())
	waitFor(t, 5*time.Second, "no key left", func() bool { return len(keys(t, admin, name+"/")) == 0 })
}

// Readers and writers cost the same two unary RPCs per acquisition (join and
// release) however many wait: their waits are driven by the prefix watch.
func TestRWMutexRPCs(t *testing.T) {
	c := etcdtest.Etcd(t)
	var requests atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		requests.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli := c.Client(t, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(count))
	})
	ctx := context.Background()
	const n, rounds = 16, 4
	rws := make([]*etcd.RWMutex, n)
	for i := range rws {
		s, err := etcd.NewSession(ctx, cli, etcd.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		rws[i] = newRWMutex(t, s, "rw/rpcs")
	}
	start := requests.Load()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, rw := range rws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				lock := rw.RLock
				if (i+r)%3 == 0 {
					lock = rw.Lock
				}
				g, err := lock(ctx)
				if err != nil {
					errs <- err
					return
				}
				time.Sleep(time.Millisecond)
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
	per := float64(requests.Load()-start) / (n * rounds)
	t.Logf("%d contenders (a third writers): %.3f unary RPCs per acquisition", n, per)
	if per > 2.2 {
		t.Fatalf("%.3f unary RPCs per acquisition, want 2", per)
	}
}
