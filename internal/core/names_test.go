package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// entries is white-box: how many names the map still holds. A slot must be
// dropped once nobody holds or waits for its name, or a long-lived session
// leaks one entry per name it ever locked.
func (n *Names) entries() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.m)
}

func mustTry(t *testing.T, n *Names, name string) func() {
	t.Helper()
	release, ok := n.TryAcquire(name)
	if !ok || release == nil {
		t.Fatalf("TryAcquire(%q) = %v, want the name free", name, ok)
	}
	return release
}

func mustBeTaken(t *testing.T, n *Names, name string) {
	t.Helper()
	if release, ok := n.TryAcquire(name); ok {
		release()
		t.Fatalf("TryAcquire(%q) succeeded although the name is held", name)
	}
}

func TestNamesZeroValue(t *testing.T) {
	var n Names
	release := mustTry(t, &n, "a")
	release()
	release2, err := n.Acquire(context.Background(), "a")
	if err != nil {
		t.Fatalf("Acquire on a free name: %v", err)
	}
	release2()
	if e := n.entries(); e != 0 {
		t.Errorf("%d entries left after every name was released", e)
	}
}

func TestNamesTryAcquireExclusion(t *testing.T) {
	var n Names
	ra := mustTry(t, &n, "a")
	mustBeTaken(t, &n, "a")
	// Different names, including prefixes and extensions of "a", are
	// independent.
	rb := mustTry(t, &n, "b")
	rab := mustTry(t, &n, "a/b")
	mustBeTaken(t, &n, "b")
	ra()
	ra2 := mustTry(t, &n, "a")
	mustBeTaken(t, &n, "a")
	ra2()
	rb()
	rab()
	if e := n.entries(); e != 0 {
		t.Errorf("%d entries left after every name was released", e)
	}
}

func TestNamesAcquireWaitsForRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n Names
		ra := mustTry(t, &n, "a")
		got := make(chan func(), 1)
		go func() {
			release, err := n.Acquire(context.Background(), "a")
			if err != nil {
				t.Errorf("Acquire: %v", err)
			}
			got <- release
		}()
		synctest.Wait() // the waiter is blocked
		select {
		case <-got:
			t.Fatal("Acquire returned while the name was held")
		default:
		}
		// Another name is not held up by the waiter.
		rb, err := n.Acquire(context.Background(), "b")
		if err != nil {
			t.Fatalf("Acquire(b): %v", err)
		}
		rb()

		ra()
		release := <-got
		mustBeTaken(t, &n, "a")
		release()
		if e := n.entries(); e != 0 {
			t.Errorf("%d entries left after every name was released", e)
		}
	})
}

// Every waiter gets the name in turn, one at a time.
func TestNamesHandoffToEveryWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n Names
		first := mustTry(t, &n, "a")
		const waiters = 10
		var inside atomic.Int32
		var wg sync.WaitGroup
		for range waiters {
			wg.Go(func() {
				release, err := n.Acquire(context.Background(), "a")
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				if v := inside.Add(1); v != 1 {
					t.Errorf("%d holders of one name at once", v)
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				release()
			})
		}
		synctest.Wait()
		first()
		wg.Wait()
		if e := n.entries(); e != 0 {
			t.Errorf("%d entries left after every waiter was served", e)
		}
	})
}

func TestNamesAcquireContextDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n Names
		ra := mustTry(t, &n, "a")

		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		release, err := n.Acquire(ctx, "a")
		if !errors.Is(err, context.DeadlineExceeded) || release != nil {
			t.Fatalf("Acquire of a held name until a deadline = (%v, %v), want (nil, DeadlineExceeded)", release != nil, err)
		}
		if d := time.Since(start); d != 50*time.Millisecond {
			t.Errorf("Acquire returned after %v, want at its deadline (50ms)", d)
		}

		ctx2, cancel2 := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := n.Acquire(ctx2, "a")
			errc <- err
		}()
		synctest.Wait()
		cancel2()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire cancelled while waiting: %v, want context.Canceled", err)
		}

		mustBeTaken(t, &n, "a")
		ra()
		if e := n.entries(); e != 0 {
			t.Errorf("%d entries left after the holder released and the waiters gave up", e)
		}
	})
}

// Waiters that give up leave nothing behind, and do not count as holders or
// free the holder's slot.
func TestNamesCancelledWaitersLeaveNoEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n Names
		ra := mustTry(t, &n, "a")
		ctx, cancel := context.WithCancel(context.Background())
		const waiters = 50
		var wg sync.WaitGroup
		for i := range waiters {
			name := "a"
			if i%5 == 0 {
				name = fmt.Sprintf("a/%d", i) // free names: taken at once
			}
			wg.Go(func() {
				release, err := n.Acquire(ctx, name)
				if err == nil {
					<-ctx.Done()
					release()
				} else if !errors.Is(err, context.Canceled) {
					t.Errorf("Acquire(%q): %v, want context.Canceled", name, err)
				}
			})
		}
		synctest.Wait()
		cancel()
		wg.Wait()

		// The holder still holds: a bad count on a cancelled waiter must not
		// have dropped or freed its slot.
		mustBeTaken(t, &n, "a")
		if e := n.entries(); e != 1 {
			t.Errorf("%d entries with one holder and no waiter, want 1", e)
		}
		ra()
		if e := n.entries(); e != 0 {
			t.Errorf("%d entries left after many cancelled waiters and the holder's release", e)
		}
		rb := mustTry(t, &n, "a")
		rb()
	})
}

func TestNamesTryAcquireFailureLeavesNoEntry(t *testing.T) {
	var n Names
	ra := mustTry(t, &n, "a")
	for range 100 {
		mustBeTaken(t, &n, "a")
	}
	ra()
	if e := n.entries(); e != 0 {
		t.Errorf("%d entries left after failed TryAcquires and the holder's release", e)
	}
}

// A second call of a release function does nothing, even after the name has
// passed to another holder.
func TestNamesReleaseIdempotent(t *testing.T) {
	var n Names
	r1 := mustTry(t, &n, "a")
	r1()
	r2 := mustTry(t, &n, "a")
	done := make(chan struct{})
	go func() {
		defer close(done)
		r1() // must neither free r2's hold nor block
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a second call of a release function blocked")
	}
	mustBeTaken(t, &n, "a")
	if e := n.entries(); e != 1 {
		t.Errorf("%d entries with one holder, want 1 (a repeated release changed the count)", e)
	}
	r2()
	r2()
	if e := n.entries(); e != 0 {
		t.Errorf("%d entries after every release", e)
	}
	r3 := mustTry(t, &n, "a")
	mustBeTaken(t, &n, "a")
	r3()
}

// A release function called from many goroutines at once releases once.
func TestNamesConcurrentDoubleRelease(t *testing.T) {
	for range 100 {
		var n Names
		r1 := mustTry(t, &n, "a")
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(r1)
		}
		wg.Wait()
		r2 := mustTry(t, &n, "a")
		mustBeTaken(t, &n, "a")
		r2()
		if e := n.entries(); e != 0 {
			t.Fatalf("%d entries after every release", e)
		}
	}
}

// Stress: goroutines lock a few names with Acquire, TryAcquire and Acquire
// with a short deadline; at most one holds a name at a time, and nothing is
// left at the end.
func TestNamesStress(t *testing.T) {
	var n Names
	names := []string{"x", "y", "z"}
	var holders [3]atomic.Int32
	var acquired atomic.Int64
	const workers, rounds = 8, 300
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				k := (w + i) % len(names)
				var release func()
				switch i % 3 {
				case 0:
					r, err := n.Acquire(context.Background(), names[k])
					if err != nil {
						t.Errorf("Acquire: %v", err)
						return
					}
					release = r
				case 1:
					r, ok := n.TryAcquire(names[k])
					if !ok {
						continue
					}
					release = r
				case 2:
					ctx, cancel := context.WithTimeout(context.Background(), 50*time.Microsecond)
					r, err := n.Acquire(ctx, names[k])
					cancel()
					if err != nil {
						if !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("Acquire with a deadline: %v", err)
							return
						}
						continue
					}
					release = r
				}
				if v := holders[k].Add(1); v != 1 {
					t.Errorf("%d holders of %q at once", v, names[k])
				}
				acquired.Add(1)
				if i%7 == 0 {
					time.Sleep(10 * time.Microsecond)
				}
				holders[k].Add(-1)
				release()
				if i%11 == 0 {
					release() // a repeated release must change nothing
				}
			}
		})
	}
	wg.Wait()
	if acquired.Load() < workers*rounds/3 {
		t.Errorf("only %d acquisitions, want at least the %d blocking ones", acquired.Load(), workers*rounds/3)
	}
	if e := n.entries(); e != 0 {
		t.Errorf("%d entries left after the stress run", e)
	}
	for _, name := range names {
		mustTry(t, &n, name)()
	}
}
