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

	"github.com/holdfast/holdfast"
)

// fakeStore plays the backend behind a Grant: it counts release and done
// calls, and release returns the queued results in turn (nil once they run
// out).
type fakeStore struct {
	mu       sync.Mutex
	releases int
	ctxs     []context.Context
	results  []error
	during   func() // runs inside release, if set

	dones     atomic.Int32
	firstDone chan struct{}
}

func newFakeStore(results ...error) *fakeStore {
	return &fakeStore{results: results, firstDone: make(chan struct{})}
}

func (f *fakeStore) release(ctx context.Context) error {
	f.mu.Lock()
	f.releases++
	f.ctxs = append(f.ctxs, ctx)
	var err error
	if len(f.results) > 0 {
		err, f.results = f.results[0], f.results[1:]
	}
	during := f.during
	f.mu.Unlock()
	if during != nil {
		during()
	}
	return err
}

func (f *fakeStore) done() {
	if f.dones.Add(1) == 1 {
		close(f.firstDone)
	}
}

func (f *fakeStore) releaseCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.releases
}

func (f *fakeStore) grant(parent context.Context) *Grant {
	return NewGrant(parent, "locks/a/694d7a3b", 42, f.release, f.done)
}

// checkEnded checks a grant that has ended with a cause that is (or wraps)
// want, after letting its AfterFunc run: done ran exactly once.
func checkEnded(t *testing.T, g *Grant, f *fakeStore, want error) {
	t.Helper()
	synctest.Wait()
	if g.Context().Err() == nil {
		t.Fatal("grant context not done")
	}
	if cause := context.Cause(g.Context()); !errors.Is(cause, want) {
		t.Errorf("cause = %v, want %v", cause, want)
	}
	if want == holdfast.ErrReleased {
		if cause := context.Cause(g.Context()); errors.Is(cause, holdfast.ErrLost) {
			t.Errorf("cause of a released grant = %v, wraps ErrLost", cause)
		}
	}
	if g.Held() {
		t.Error("Held() = true after the grant ended")
	}
	if n := f.dones.Load(); n != 1 {
		t.Errorf("done called %d times, want exactly once", n)
	}
}

func checkLive(t *testing.T, g *Grant, f *fakeStore) {
	t.Helper()
	if err := g.Context().Err(); err != nil {
		t.Fatalf("grant context done (%v, cause %v), want it live", err, context.Cause(g.Context()))
	}
	if !g.Held() {
		t.Error("Held() = false, want true")
	}
	if n := f.dones.Load(); n != 0 {
		t.Errorf("done called %d times on a live grant", n)
	}
}

var errTransport = errors.New("connection refused")

type ctxKey struct{}

func TestGrantAccessors(t *testing.T) {
	parent := context.WithValue(context.Background(), ctxKey{}, "session")
	f := newFakeStore()
	g := f.grant(parent)
	var _ holdfast.Grant = g
	if g.Key() != "locks/a/694d7a3b" {
		t.Errorf("Key() = %q", g.Key())
	}
	if g.Token() != 42 {
		t.Errorf("Token() = %v, want 42", g.Token())
	}
	if g.Context().Value(ctxKey{}) != "session" {
		t.Error("grant context is not a child of the parent passed to NewGrant")
	}
	checkLive(t, g, f)
	if f.releaseCalls() != 0 {
		t.Errorf("release called %d times by NewGrant", f.releaseCalls())
	}
}

func TestGrantUnlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		g := f.grant(context.Background())
		ctx := context.WithValue(context.Background(), ctxKey{}, "unlock")
		if err := g.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		// done frees the in-process name slot: it must have run when Unlock
		// returns, so that the next Lock through the session can proceed.
		if n := f.dones.Load(); n != 1 {
			t.Errorf("done called %d times when Unlock returned, want 1", n)
		}
		if f.releaseCalls() != 1 {
			t.Fatalf("release called %d times, want 1", f.releaseCalls())
		}
		if f.ctxs[0].Value(ctxKey{}) != "unlock" {
			t.Error("release was not given Unlock's context")
		}
		checkEnded(t, g, f, holdfast.ErrReleased)
		if context.Cause(g.Context()) != holdfast.ErrReleased {
			t.Errorf("cause = %v, want ErrReleased itself", context.Cause(g.Context()))
		}
		if g.Context().Err() != context.Canceled {
			t.Errorf("Context().Err() = %v, want context.Canceled", g.Context().Err())
		}
		if g.Token() != 42 || g.Key() != "locks/a/694d7a3b" {
			t.Error("Key or Token changed after Unlock")
		}

		err := g.Unlock(context.Background())
		if !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("second Unlock: %v, want ErrNotHeld", err)
		}
		if f.releaseCalls() != 1 {
			t.Errorf("second Unlock called release again (%d calls)", f.releaseCalls())
		}
		if g.Reenter() {
			t.Error("Reenter after Unlock returned true")
		}
		checkEnded(t, g, f, holdfast.ErrReleased)
	})
}

func TestGrantUnlockTransportErrorKeepsGrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore(errTransport, errTransport)
		g := f.grant(context.Background())
		for i := range 2 {
			err := g.Unlock(context.Background())
			if !errors.Is(err, errTransport) {
				t.Fatalf("Unlock #%d with a failing store: %v, want it to wrap the transport error", i+1, err)
			}
			if errors.Is(err, holdfast.ErrNotHeld) {
				t.Errorf("Unlock #%d with a failing store: %v wraps ErrNotHeld, but the grant may still be held", i+1, err)
			}
			synctest.Wait()
			checkLive(t, g, f)
		}
		if err := g.Unlock(context.Background()); err != nil {
			t.Fatalf("retried Unlock: %v", err)
		}
		if f.releaseCalls() != 3 {
			t.Errorf("release called %d times, want 3", f.releaseCalls())
		}
		checkEnded(t, g, f, holdfast.ErrReleased)
	})
}

// The guard failed although nothing reported a loss: the key was removed or
// taken over from outside. That is a loss, not a release.
func TestGrantUnlockGuardFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore(fmt.Errorf("%w: create revision changed", holdfast.ErrNotHeld))
		g := f.grant(context.Background())
		err := g.Unlock(context.Background())
		if !errors.Is(err, holdfast.ErrNotHeld) {
			t.Fatalf("Unlock whose guard failed: %v, want ErrNotHeld", err)
		}
		checkEnded(t, g, f, holdfast.ErrLost)
		if cause := context.Cause(g.Context()); errors.Is(cause, holdfast.ErrReleased) {
			t.Errorf("cause %v wraps ErrReleased", cause)
		}
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("second Unlock: %v, want ErrNotHeld", err)
		}
		if f.releaseCalls() != 1 {
			t.Errorf("release called %d times, want 1", f.releaseCalls())
		}
		checkEnded(t, g, f, holdfast.ErrLost)
	})
}

func TestGrantReentrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore(errTransport)
		g := f.grant(context.Background())
		for i := range 2 {
			if !g.Reenter() {
				t.Fatalf("Reenter #%d on a held grant returned false", i+1)
			}
		}
		for i := range 2 { // 3 holds: the first two Unlocks keep it
			if err := g.Unlock(context.Background()); err != nil {
				t.Fatalf("inner Unlock #%d: %v", i+1, err)
			}
			synctest.Wait()
			checkLive(t, g, f)
			if f.releaseCalls() != 0 {
				t.Fatalf("inner Unlock #%d called release", i+1)
			}
		}
		// The last hold: a transport error keeps it, and it is still the last.
		if err := g.Unlock(context.Background()); !errors.Is(err, errTransport) {
			t.Fatalf("last Unlock with a failing store: %v", err)
		}
		checkLive(t, g, f)
		if err := g.Unlock(context.Background()); err != nil {
			t.Fatalf("last Unlock, retried: %v", err)
		}
		if f.releaseCalls() != 2 {
			t.Errorf("release called %d times, want 2 (once failing, once by the retry)", f.releaseCalls())
		}
		checkEnded(t, g, f, holdfast.ErrReleased)
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("Unlock beyond the holds: %v, want ErrNotHeld", err)
		}
		if g.Reenter() {
			t.Error("Reenter after the last Unlock returned true")
		}
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("Unlock after a refused Reenter: %v, want ErrNotHeld", err)
		}
		if f.releaseCalls() != 2 {
			t.Errorf("release called %d times, want 2", f.releaseCalls())
		}
	})
}

func TestGrantReenterAfterLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lossErr := fmt.Errorf("%w: key deleted", holdfast.ErrLost)
		f := newFakeStore()
		g := f.grant(context.Background())
		g.Lose(lossErr)
		if g.Reenter() {
			t.Fatal("Reenter after Lose returned true")
		}
		// The refused Reenter added no hold: one Unlock ends it.
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("Unlock after loss: %v, want ErrNotHeld", err)
		}
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("second Unlock after loss: %v, want ErrNotHeld", err)
		}
		if n := f.releaseCalls(); n > 1 {
			t.Errorf("release called %d times, want at most 1 (cleanup)", n)
		}
		checkEnded(t, g, f, lossErr)
	})
}

func TestGrantLoseBeforeUnlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lossErr := fmt.Errorf("%w: key deleted", holdfast.ErrLost)
		f := newFakeStore()
		g := f.grant(context.Background())
		g.Lose(lossErr)
		if context.Cause(g.Context()) != lossErr {
			t.Fatalf("cause after Lose = %v, want the loss", context.Cause(g.Context()))
		}
		if g.Held() {
			t.Error("Held() = true after Lose")
		}
		// done frees the name slot on loss, without waiting for Unlock.
		checkEnded(t, g, f, lossErr)

		g.Lose(errors.New("second loss"))
		if context.Cause(g.Context()) != lossErr {
			t.Errorf("a second Lose replaced the cause: %v", context.Cause(g.Context()))
		}

		err := g.Unlock(context.Background())
		if !errors.Is(err, holdfast.ErrNotHeld) {
			t.Fatalf("Unlock after loss: %v, want ErrNotHeld", err)
		}
		if !errors.Is(err, holdfast.ErrLost) {
			t.Errorf("Unlock after loss: %v, want it to say why (wrap the loss)", err)
		}
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("second Unlock after loss: %v, want ErrNotHeld", err)
		}
		if n := f.releaseCalls(); n > 1 {
			t.Errorf("release called %d times, want at most 1 (cleanup)", n)
		}
		checkEnded(t, g, f, lossErr)
		if context.Cause(g.Context()) != lossErr {
			t.Errorf("Unlock after loss changed the cause to %v", context.Cause(g.Context()))
		}
	})
}

// The cleanup release after a loss finds the key gone (guard fails): still
// ErrNotHeld, and the loss stays the cause.
func TestGrantUnlockAfterLossGuardFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lossErr := fmt.Errorf("%w: key deleted", holdfast.ErrLost)
		f := newFakeStore(fmt.Errorf("%w: gone", holdfast.ErrNotHeld))
		g := f.grant(context.Background())
		g.Lose(lossErr)
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Fatalf("Unlock after loss: %v, want ErrNotHeld", err)
		}
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("second Unlock after loss: %v, want ErrNotHeld", err)
		}
		if n := f.releaseCalls(); n > 1 {
			t.Errorf("release called %d times, want at most 1", n)
		}
		checkEnded(t, g, f, lossErr)
		if context.Cause(g.Context()) != lossErr {
			t.Errorf("cause = %v, want the loss", context.Cause(g.Context()))
		}
	})
}

// BUG (grant.go, Unlock): after a loss, a transport error from the cleanup
// release is returned as is and the grant keeps count 1, so Unlock of a lost
// grant does not return ErrNotHeld, as holdfast.Grant.Unlock documents
// ("returns ErrNotHeld if the grant was already released or lost"). The
// typical case is a session lost in a partition: the store is unreachable,
// so the cleanup fails too. The Consul backend works around it in its
// release (consul/txn.go); the etcd backend does not, so etcd's Unlock after
// a partition returns "holdfast: unlock ...: context deadline exceeded".
//
// Fix, in Unlock: when lost, end the grant whatever release returned:
//
//	err := g.release(ctx)
//	if err != nil && !lost && !errors.Is(err, holdfast.ErrNotHeld) {
//		return fmt.Errorf("holdfast: unlock %s: %w", g.key, err)
//	}
//
// (and keep err in the ErrNotHeld message for the lost case if wanted; the
// Consul workaround then becomes redundant but harmless).
func TestGrantUnlockAfterLossCleanupFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sessionLost := fmt.Errorf("%w: no renewal acknowledged", holdfast.ErrSessionLost)
		parent, cancel := context.WithCancelCause(context.Background())
		f := newFakeStore(errTransport, errTransport)
		g := f.grant(parent)
		cancel(sessionLost)
		err := g.Unlock(context.Background())
		if !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("Unlock of a lost grant whose cleanup failed: %v, want ErrNotHeld", err)
		}
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("second Unlock of a lost grant: %v, want ErrNotHeld", err)
		}
		if n := f.releaseCalls(); n > 1 {
			t.Errorf("release called %d times, want at most 1", n)
		}
		checkEnded(t, g, f, sessionLost)
	})
}

func TestGrantLoseAfterUnlockIsNoOp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		g := f.grant(context.Background())
		if err := g.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		g.Lose(fmt.Errorf("%w: late watch event", holdfast.ErrLost))
		if context.Cause(g.Context()) != holdfast.ErrReleased {
			t.Errorf("cause after Unlock then Lose = %v, want ErrReleased", context.Cause(g.Context()))
		}
		checkEnded(t, g, f, holdfast.ErrReleased)
	})
}

// A loss noticed while our own Unlock is in flight (the watch sees our own
// delete) must not turn the release into a loss.
func TestGrantLoseDuringUnlock(t *testing.T) {
	t.Parallel()
	lossErr := fmt.Errorf("%w: key deleted", holdfast.ErrLost)
	for range 20 {
		f := newFakeStore()
		g := f.grant(context.Background())
		lost := make(chan struct{})
		f.during = func() {
			started := make(chan struct{})
			go func() {
				close(started)
				g.Lose(lossErr)
				close(lost)
			}()
			<-started
			time.Sleep(200 * time.Microsecond) // let Lose run, or block, now
		}
		if err := g.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		<-lost
		if cause := context.Cause(g.Context()); cause != holdfast.ErrReleased {
			t.Fatalf("a Lose during a successful Unlock made the cause %v, want ErrReleased", cause)
		}
		select {
		case <-f.firstDone:
		case <-time.After(5 * time.Second):
			t.Fatal("done not called")
		}
	}
}

// Lose and Unlock race freely: a successful Unlock always ends with cause
// ErrReleased, a failed one with the loss, and done runs once.
func TestGrantLoseUnlockRace(t *testing.T) {
	t.Parallel()
	lossErr := fmt.Errorf("%w: key deleted", holdfast.ErrLost)
	var released, lostFirst int
	for i := range 500 {
		f := newFakeStore()
		g := f.grant(context.Background())
		start := make(chan struct{})
		var wg sync.WaitGroup
		var unlockErr error
		wg.Go(func() {
			<-start
			unlockErr = g.Unlock(context.Background())
		})
		wg.Go(func() {
			<-start
			if i%2 == 0 {
				time.Sleep(time.Duration(i%5) * time.Microsecond)
			}
			g.Lose(lossErr)
		})
		close(start)
		wg.Wait()
		cause := context.Cause(g.Context())
		switch {
		case unlockErr == nil:
			released++
			if cause != holdfast.ErrReleased {
				t.Fatalf("round %d: Unlock succeeded but the cause is %v, want ErrReleased", i, cause)
			}
		case errors.Is(unlockErr, holdfast.ErrNotHeld):
			lostFirst++
			if cause != lossErr {
				t.Fatalf("round %d: Unlock returned %v but the cause is %v, want the loss", i, unlockErr, cause)
			}
		default:
			t.Fatalf("round %d: Unlock: %v", i, unlockErr)
		}
		select {
		case <-f.firstDone:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: done not called", i)
		}
		if n := f.dones.Load(); n != 1 {
			t.Fatalf("round %d: done called %d times", i, n)
		}
	}
	t.Logf("%d released, %d lost first", released, lostFirst)
}

// The grant context is a child of the session's: a lost session cancels the
// grant with the session's cause.
func TestGrantParentCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sessionLost := fmt.Errorf("%w: no renewal acknowledged", holdfast.ErrSessionLost)
		parent, cancel := context.WithCancelCause(context.Background())
		f := newFakeStore()
		g := f.grant(parent)
		reentered := g.Reenter()
		if !reentered {
			t.Fatal("Reenter on a held grant returned false")
		}
		cancel(sessionLost)
		checkEnded(t, g, f, sessionLost)
		if context.Cause(g.Context()) != sessionLost {
			t.Errorf("cause = %v, want the session's cause", context.Cause(g.Context()))
		}
		if !errors.Is(context.Cause(g.Context()), holdfast.ErrLost) {
			t.Error("cause does not wrap ErrLost")
		}
		if g.Reenter() {
			t.Error("Reenter after the session was lost returned true")
		}
		g.Lose(errors.New("later loss"))
		if context.Cause(g.Context()) != sessionLost {
			t.Errorf("Lose after the session loss replaced the cause with %v", context.Cause(g.Context()))
		}
		// Two holds. However many Unlocks it takes, the last says
		// ErrNotHeld with the session's cause, and release runs at most once.
		var err error
		for range 2 {
			err = g.Unlock(context.Background())
		}
		if !errors.Is(err, holdfast.ErrNotHeld) || !errors.Is(err, holdfast.ErrSessionLost) {
			t.Errorf("last Unlock after the session was lost: %v, want ErrNotHeld wrapping ErrSessionLost", err)
		}
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("Unlock beyond the holds: %v, want ErrNotHeld", err)
		}
		if n := f.releaseCalls(); n > 1 {
			t.Errorf("release called %d times, want at most 1", n)
		}
		checkEnded(t, g, f, sessionLost)
	})
}

func TestGrantParentAlreadyDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		cancel(holdfast.ErrSessionClosed)
		f := newFakeStore()
		g := f.grant(parent)
		checkEnded(t, g, f, holdfast.ErrSessionClosed)
		if g.Reenter() {
			t.Error("Reenter returned true")
		}
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("Unlock: %v, want ErrNotHeld", err)
		}
		checkEnded(t, g, f, holdfast.ErrSessionClosed)
	})
}

func TestGrantUnlockNilContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		g := f.grant(context.Background())
		var nilCtx context.Context
		if err := g.Unlock(nilCtx); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Fatalf("Unlock(nil): %v, want ErrInvalidArgument", err)
		}
		if f.releaseCalls() != 0 {
			t.Error("Unlock(nil) called release")
		}
		synctest.Wait()
		checkLive(t, g, f)
		if err := g.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock after Unlock(nil): %v", err)
		}
		checkEnded(t, g, f, holdfast.ErrReleased)
	})
}

func TestGrantNilDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		g1 := NewGrant(context.Background(), "k1", 1, f.release, nil)
		if err := g1.Unlock(context.Background()); err != nil {
			t.Errorf("Unlock of a grant without done: %v", err)
		}
		g2 := NewGrant(context.Background(), "k2", 2, f.release, nil)
		g2.Lose(holdfast.ErrLost)
		synctest.Wait()
		if err := g2.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("Unlock of a lost grant without done: %v", err)
		}
	})
}

// Grants are safe for concurrent use: Reenter/Unlock/Held from many
// goroutines balance out, and release runs once at the end.
func TestGrantConcurrentReentrancy(t *testing.T) {
	t.Parallel()
	f := newFakeStore()
	g := f.grant(context.Background())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				if !g.Reenter() {
					t.Error("Reenter on a held grant returned false")
					return
				}
				_ = g.Held()
				if err := g.Unlock(context.Background()); err != nil {
					t.Errorf("inner Unlock: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if !g.Held() || f.releaseCalls() != 0 {
		t.Fatalf("after balanced Reenter/Unlock: Held %v, %d releases; want held, none", g.Held(), f.releaseCalls())
	}
	if err := g.Unlock(context.Background()); err != nil {
		t.Fatalf("last Unlock: %v", err)
	}
	if f.releaseCalls() != 1 || context.Cause(g.Context()) != holdfast.ErrReleased {
		t.Errorf("after the last Unlock: %d releases, cause %v", f.releaseCalls(), context.Cause(g.Context()))
	}
}
