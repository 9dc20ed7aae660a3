package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/holdfast/holdfast"
)

// fakeStore plays the backend behind a Grant. release returns the queued
// results in turn (nil once they run out); a result of errBlock makes that
// attempt wait until its context ends, as a frozen store would.
type fakeStore struct {
	mu       sync.Mutex
	releases int
	results  []error

	dones atomic.Int32
}

var (
	errTransport = errors.New("connection refused")
	errBlock     = errors.New("block until the attempt's context ends")
)

func newFakeStore(results ...error) *fakeStore { return &fakeStore{results: results} }

func (f *fakeStore) release(ctx context.Context) error {
	f.mu.Lock()
	f.releases++
	var err error
	if len(f.results) > 0 {
		err, f.results = f.results[0], f.results[1:]
	}
	f.mu.Unlock()
	if err == errBlock {
		<-ctx.Done()
		return ctx.Err()
	}
	return err
}

func (f *fakeStore) done() { f.dones.Add(1) }

func (f *fakeStore) releaseCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.releases
}

// session is a Keeper (TTL 60 s, margin 12 s) and its Background.
type session struct {
	k  *Keeper
	bg *Background
}

func newSession() session {
	k := NewKeeper(time.Now(), time.Minute, 12*time.Second)
	return session{k, NewBackground(k.Context())}
}

func (s session) close() {
	s.k.End(holdfast.ErrSessionClosed)
	s.bg.Wait()
}

func (f *fakeStore) grant(s session) *Grant {
	return NewGrant(s.k, s.bg, "locks/a/694d7a3b", 42, ReleaseFunc(f.release), f.done)
}

// checkEnded checks a grant whose end is over: its context is done with a
// cause matching want, and done ran exactly once.
func checkEnded(t *testing.T, g *Grant, f *fakeStore, want error) {
	t.Helper()
	synctest.Wait()
	if g.Context().Err() == nil {
		t.Fatal("grant context not done")
	}
	if cause := context.Cause(g.Context()); !errors.Is(cause, want) {
		t.Errorf("cause = %v, want %v", cause, want)
	}
	if g.Held() {
		t.Error("Held() = true after the grant ended")
	}
	select {
	case <-g.Finished():
	default:
		t.Error("the grant's end in the store is not over")
	}
	if n := f.dones.Load(); n != 1 {
		t.Errorf("done called %d times, want exactly once", n)
	}
}

func TestGrantAccessors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		defer s.close()
		f := newFakeStore()
		g := f.grant(s)
		var _ holdfast.Grant = g
		if g.Key() != "locks/a/694d7a3b" || g.Token() != 42 {
			t.Errorf("Key, Token = %q, %v", g.Key(), g.Token())
		}
		if !g.Deadline().Equal(s.k.Deadline()) {
			t.Errorf("Deadline() = %v, want the session's %v", g.Deadline(), s.k.Deadline())
		}
		if d, ok := g.Context().Deadline(); ok {
			t.Errorf("Context().Deadline() = %v, true; a context deadline cannot move with renewals", d)
		}
		// Renewals move the grant's deadline.
		time.Sleep(time.Second)
		s.k.Renewed(time.Now(), time.Minute, 12*time.Second)
		if want := time.Now().Add(48 * time.Second); !g.Deadline().Equal(want) {
			t.Errorf("Deadline() after a renewal = %v, want %v", g.Deadline(), want)
		}
		if !g.Held() || g.Context().Err() != nil || f.releaseCalls() != 0 || f.dones.Load() != 0 {
			t.Error("a new grant is not held, or touched the store")
		}
	})
}

func TestGrantUnlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		defer s.close()
		f := newFakeStore()
		g := f.grant(s)
		if err := g.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		// done frees the in-process name: it has run when Unlock returns.
		if n := f.dones.Load(); n != 1 {
			t.Errorf("done called %d times when Unlock returned, want 1", n)
		}
		checkEnded(t, g, f, holdfast.ErrReleased)
		if context.Cause(g.Context()) != holdfast.ErrReleased || g.Context().Err() != context.Canceled {
			t.Errorf("cause, Err = %v, %v; want ErrReleased, context.Canceled", context.Cause(g.Context()), g.Context().Err())
		}
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("second Unlock: %v, want ErrNotHeld", err)
		}
		if f.releaseCalls() != 1 {
			t.Errorf("release called %d times, want 1", f.releaseCalls())
		}
	})
}

// Transport errors are retried in the background; an Unlock whose context
// allows it waits for the confirmation.
func TestGrantUnlockRetriesTransportErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		defer s.close()
		f := newFakeStore(errTransport, errTransport)
		g := f.grant(s)
		if err := g.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		if f.releaseCalls() != 3 {
			t.Errorf("release called %d times, want 3", f.releaseCalls())
		}
		checkEnded(t, g, f, holdfast.ErrReleased)
	})
}

// Defect 1 and 2 of the hardening issue: with the store frozen, Unlock
// returns when its context ends, the grant is over locally at once, and the
// release goes on in the background until the store answers; only then is
// the name freed.
func TestGrantUnlockBoundedByContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		defer s.close()
		f := newFakeStore(errBlock, errBlock, errBlock)
		g := f.grant(s)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := g.Unlock(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, holdfast.ErrNotHeld) {
			t.Fatalf("Unlock on a frozen store: %v, want DeadlineExceeded (not ErrNotHeld)", err)
		}
		if took := time.Since(start); took != 300*time.Millisecond {
			t.Errorf("Unlock took %v, want exactly its 300ms context", took)
		}
		if cause := context.Cause(g.Context()); cause != holdfast.ErrReleased {
			t.Errorf("cause = %v, want ErrReleased: the grant ends locally at once", cause)
		}
		if f.dones.Load() != 0 {
			t.Fatal("name freed before the store confirmed the release")
		}
		// Three attempts time out (2 s each, with pauses), the fourth works.
		time.Sleep(10 * time.Second)
		checkEnded(t, g, f, holdfast.ErrReleased)
		if n := f.releaseCalls(); n != 4 {
			t.Errorf("release called %d times, want 4", n)
		}

		// An Unlock whose context is already done still releases.
		f2 := newFakeStore()
		g2 := f2.grant(s)
		done, cancel2 := context.WithCancel(context.Background())
		cancel2()
		_ = g2.Unlock(done)
		checkEnded(t, g2, f2, holdfast.ErrReleased)
		if f2.releaseCalls() != 1 {
			t.Errorf("release after Unlock(cancelled ctx) called %d times, want 1", f2.releaseCalls())
		}
	})
}

// The guard failed although nothing reported a loss: the key was removed or
// taken over from outside. Unlock says so with ErrNotHeld.
func TestGrantUnlockGuardFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		defer s.close()
		f := newFakeStore(fmt.Errorf("%w: create revision changed", holdfast.ErrNotHeld))
		g := f.grant(s)
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Fatalf("Unlock whose guard failed: %v, want ErrNotHeld", err)
		}
		if f.releaseCalls() != 1 {
			t.Errorf("release called %d times, want 1 (a failed guard is final)", f.releaseCalls())
		}
		checkEnded(t, g, f, holdfast.ErrReleased)
	})
}

// A first release attempt without an answer, retried by the session, and
// the retry's guard failed: the first attempt may have removed the key.
// Unlock says both, with ErrNotHeld; with no retry, it says "from outside"
// alone.
func TestGrantUnlockRetriedGuardFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		defer s.close()
		f := newFakeStore(errors.New("connection reset"), fmt.Errorf("%w: create revision changed", holdfast.ErrNotHeld))
		g := f.grant(s)
		err := g.Unlock(context.Background())
		if !errors.Is(err, holdfast.ErrNotHeld) || !strings.Contains(err.Error(), "the first attempt (connection reset) may have removed it with its answer lost, or it was removed or taken over from outside") {
			t.Fatalf("Unlock whose retried release found the key gone: %v, want ErrNotHeld saying the first attempt may have removed it", err)
		}
		if f.releaseCalls() != 2 {
			t.Errorf("release called %d times, want 2", f.releaseCalls())
		}
		checkEnded(t, g, f, holdfast.ErrReleased)

		f = newFakeStore(fmt.Errorf("%w: create revision changed", holdfast.ErrNotHeld))
		if err := f.grant(s).Unlock(context.Background()); strings.Contains(err.Error(), "first attempt") || !strings.Contains(err.Error(), "from outside") {
			t.Errorf("Unlock whose first release found the key gone: %v, want it to say from outside alone", err)
		}
	})
}

func TestGrantReentrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		defer s.close()
		f := newFakeStore()
		g := f.grant(s)
		r := Reentry[*Grant]{Enabled: true}
		if _, ok := r.Enter(); ok {
			t.Fatal("Enter with nothing remembered succeeded")
		}
		r.Remember(g, g)
		for i := range 2 {
			if got, ok := r.Enter(); !ok || got != g {
				t.Fatalf("Enter #%d on a held grant = %v, %v", i+1, got, ok)
			}
		}
		for i := range 2 { // 3 holds: the first two Unlocks keep it
			if err := g.Unlock(context.Background()); err != nil {
				t.Fatalf("inner Unlock #%d: %v", i+1, err)
			}
			if !g.Held() || f.releaseCalls() != 0 {
				t.Fatalf("inner Unlock #%d released the grant", i+1)
			}
		}
		if err := g.Unlock(context.Background()); err != nil {
			t.Fatalf("last Unlock: %v", err)
		}
		checkEnded(t, g, f, holdfast.ErrReleased)
		if _, ok := r.Enter(); ok {
			t.Error("Enter after the last Unlock succeeded")
		}
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("Unlock beyond the holds: %v, want ErrNotHeld", err)
		}

		off := Reentry[*Grant]{}
		g2 := f.grant(s)
		off.Remember(g2, g2)
		if _, ok := off.Enter(); ok {
			t.Error("Enter on a disabled Reentry succeeded")
		}
		_ = g2.Unlock(context.Background())
	})
}

// A lost grant ends at once: Unlock returns ErrNotHeld with the cause
// without waiting for the store, even a frozen one; the leftover is removed
// by one bounded attempt in the background, then the name is freed.
func TestGrantLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		defer s.close()
		lossErr := fmt.Errorf("%w: key deleted", holdfast.ErrLost)
		f := newFakeStore(errBlock)
		g := f.grant(s)
		g.Lose(lossErr)
		if g.Held() {
			t.Error("Held() = true after Lose")
		}
		r := Reentry[*Grant]{Enabled: true}
		r.Remember(g, g)
		if _, ok := r.Enter(); ok {
			t.Error("Enter after Lose succeeded")
		}
		start := time.Now()
		err := g.Unlock(context.Background())
		if !errors.Is(err, holdfast.ErrNotHeld) || !errors.Is(err, lossErr) {
			t.Fatalf("Unlock after loss: %v, want ErrNotHeld wrapping the loss", err)
		}
		if took := time.Since(start); took != 0 {
			t.Errorf("Unlock of a lost grant took %v, want no wait", took)
		}
		time.Sleep(AttemptTimeout)
		checkEnded(t, g, f, lossErr)
		if n := f.releaseCalls(); n != 1 {
			t.Errorf("release called %d times after a loss, want 1 (best effort)", n)
		}
		// A loss after Unlock changes nothing.
		f2 := newFakeStore()
		g2 := f2.grant(s)
		if err := g2.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
		g2.Lose(lossErr)
		checkEnded(t, g2, f2, holdfast.ErrReleased)
	})
}

// When the session ends, every grant ends with its cause, and no release is
// attempted: the store frees the session's keys itself.
func TestGrantSessionEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		f := newFakeStore()
		g := f.grant(s)
		time.Sleep(48 * time.Second) // the safe deadline
		synctest.Wait()
		checkEnded(t, g, f, holdfast.ErrSessionLost)
		if err := g.Unlock(context.Background()); !errors.Is(err, holdfast.ErrSessionLost) || !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("Unlock after the session was lost: %v, want ErrNotHeld wrapping ErrSessionLost", err)
		}
		if f.releaseCalls() != 0 {
			t.Errorf("release called %d times after the session ended", f.releaseCalls())
		}
		// A grant created on an ended session is over at once.
		f2 := newFakeStore()
		g2 := f2.grant(s)
		checkEnded(t, g2, f2, holdfast.ErrSessionLost)
		s.close()
	})
}

// Defect 9 of the hardening issue: after a pause past the safe deadline,
// the grant's context is done at the first look, before any timer fired.
func TestGrantContextChecksDeadline(t *testing.T) {
	k := NewKeeper(time.Now(), time.Hour, 0)
	bg := NewBackground(k.Context())
	defer func() { k.End(holdfast.ErrSessionClosed); bg.Wait() }()
	g := NewGrant(k, bg, "k", 1, ReleaseFunc(func(context.Context) error { return nil }), nil)
	// Move the deadline into the past without firing the timer: a
	// renewal never moves it back, so rebuild the state by hand.
	k.mu.Lock()
	k.deadline = time.Now().Add(-time.Millisecond)
	k.mu.Unlock()
	if err := g.Context().Err(); err == nil {
		t.Fatal("Context().Err() = nil after the deadline passed")
	}
	if !errors.Is(context.Cause(g.Context()), holdfast.ErrSessionLost) {
		t.Errorf("cause = %v, want ErrSessionLost", context.Cause(g.Context()))
	}
	select {
	case <-g.Context().Done():
	default:
		t.Error("Done() not closed after Err() reported the loss")
	}
}

func TestGrantDoneChecksDeadline(t *testing.T) {
	k := NewKeeper(time.Now(), time.Hour, 0)
	bg := NewBackground(k.Context())
	defer func() { k.End(holdfast.ErrSessionClosed); bg.Wait() }()
	g := NewGrant(k, bg, "k", 1, ReleaseFunc(func(context.Context) error { return nil }), nil)
	k.mu.Lock()
	k.deadline = time.Now().Add(-time.Millisecond)
	k.mu.Unlock()
	select {
	case <-g.Context().Done():
	default:
		t.Fatal("Done() not closed at the first look after the deadline passed")
	}
	if g.Held() {
		t.Error("Held() = true after the deadline passed")
	}
}

func TestGrantUnlockNilContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		defer s.close()
		f := newFakeStore()
		g := f.grant(s)
		//lint:ignore SA1012 testing the nil check
		if err := g.Unlock(nil); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Fatalf("Unlock(nil): %v, want ErrInvalidArgument", err)
		}
		if !g.Held() || f.releaseCalls() != 0 {
			t.Error("Unlock(nil) changed the grant")
		}
		_ = g.Unlock(context.Background())
	})
}

// Concurrent Unlocks, Loses and reentries: exactly one release path runs and
// done runs once.
func TestGrantConcurrentEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		defer s.close()
		for range 50 {
			f := newFakeStore()
			g := f.grant(s)
			r := Reentry[*Grant]{Enabled: true}
			r.Remember(g, g)
			var wg sync.WaitGroup
			var nils atomic.Int32
			for i := range 4 {
				wg.Go(func() {
					switch i % 3 {
					case 0:
						if g.Unlock(context.Background()) == nil {
							nils.Add(1)
						}
					case 1:
						g.Lose(fmt.Errorf("%w: test", holdfast.ErrLost))
					case 2:
						if _, ok := r.Enter(); ok && g.Unlock(context.Background()) == nil {
							nils.Add(1)
						}
					}
				})
			}
			wg.Wait()
			synctest.Wait()
			if n := f.dones.Load(); n != 1 {
				t.Fatalf("done called %d times", n)
			}
			if n := f.releaseCalls(); n > 1 {
				t.Fatalf("release called %d times", n)
			}
		}
	})
}

func TestBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		bg := NewBackground(ctx)
		var ran atomic.Int32
		if !bg.Go(func(ctx context.Context) { <-ctx.Done(); ran.Add(1) }) {
			t.Fatal("Go refused a task before Wait")
		}
		cancel()
		bg.Wait()
		if ran.Load() != 1 {
			t.Error("Wait returned before the task ended")
		}
		if bg.Go(func(context.Context) { ran.Add(1) }) {
			t.Error("Go accepted a task after Wait")
		}
	})
}

func TestRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Transport errors are retried; attempts are bounded.
		f := newFakeStore(errBlock, errTransport)
		start := time.Now()
		if err := Retry(context.Background(), f.release); err != nil {
			t.Fatalf("Retry: %v", err)
		}
		if f.releaseCalls() != 3 {
			t.Errorf("%d attempts, want 3", f.releaseCalls())
		}
		if took := time.Since(start); took != AttemptTimeout+RetryFirstPause+2*RetryFirstPause {
			t.Errorf("took %v", took)
		}
		// Final errors are not retried.
		for _, final := range []error{holdfast.ErrNotHeld, holdfast.ErrPermissionDenied, holdfast.ErrSessionLost, holdfast.ErrSessionClosed} {
			f := newFakeStore(fmt.Errorf("x: %w", final))
			if err := Retry(context.Background(), f.release); !errors.Is(err, final) || f.releaseCalls() != 1 {
				t.Errorf("Retry with %v: %v after %d attempts, want it after 1", final, err, f.releaseCalls())
			}
		}
		// The context's cause ends the retries.
		ctx, cancel := context.WithCancelCause(context.Background())
		f = newFakeStore(errTransport, errTransport, errTransport, errTransport, errTransport)
		time.AfterFunc(120*time.Millisecond, func() { cancel(holdfast.ErrSessionClosed) })
		if err := Retry(ctx, f.release); !errors.Is(err, holdfast.ErrSessionClosed) {
			t.Errorf("Retry after its context ended: %v, want the cause", err)
		}
	})
}

func TestBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The zero Backoff leaves an attempt unbounded: a blocking
		// attempt runs until ctx ends, and the ctx's cause is returned.
		f := newFakeStore(errBlock)
		ctx, cancel := context.WithCancelCause(context.Background())
		time.AfterFunc(time.Minute, func() { cancel(holdfast.ErrSessionClosed) })
		start := time.Now()
		if err := (Backoff{}).Retry(ctx, f.release); !errors.Is(err, holdfast.ErrSessionClosed) {
			t.Errorf("Retry of a blocking attempt: %v, want the cause", err)
		}
		if took := time.Since(start); took != time.Minute || f.releaseCalls() != 1 {
			t.Errorf("took %v and %d attempts, want 1m0s and 1", took, f.releaseCalls())
		}
		// First and Max set the pauses: 10, 20, 25, 25 ms.
		f = newFakeStore(errTransport, errTransport, errTransport, errTransport)
		start = time.Now()
		if err := (Backoff{First: 10 * time.Millisecond, Max: 25 * time.Millisecond}).Retry(context.Background(), f.release); err != nil {
			t.Fatalf("Retry: %v", err)
		}
		if took := time.Since(start); took != 80*time.Millisecond || f.releaseCalls() != 5 {
			t.Errorf("took %v and %d attempts, want 80ms and 5", took, f.releaseCalls())
		}
		// Final replaces the definition of a final error: here a lost
		// key is retried, a closed session is not.
		retryLost := Backoff{Final: func(err error) bool { return Final(err) && !errors.Is(err, holdfast.ErrLost) }}
		f = newFakeStore(holdfast.ErrLost, holdfast.ErrLost, holdfast.ErrSessionClosed)
		if err := retryLost.Retry(context.Background(), f.release); !errors.Is(err, holdfast.ErrSessionClosed) || f.releaseCalls() != 3 {
			t.Errorf("Retry with its own Final: %v after %d attempts, want ErrSessionClosed after 3", err, f.releaseCalls())
		}
		// A final error comes before the end of ctx: the session's end is
		// reported even if the caller gave up at the same moment.
		ctx, cancel2 := context.WithCancel(context.Background())
		cancel2()
		f = newFakeStore(holdfast.ErrSessionLost)
		if err := (Backoff{}).Retry(ctx, f.release); !errors.Is(err, holdfast.ErrSessionLost) {
			t.Errorf("Retry with a final error and an ended ctx: %v, want ErrSessionLost", err)
		}
		// Tries bounds the attempts: the last one's error is returned.
		f = newFakeStore(errTransport, errTransport, errTransport, errTransport)
		if err := (Backoff{Tries: 3}).Retry(context.Background(), f.release); !errors.Is(err, errTransport) || f.releaseCalls() != 3 {
			t.Errorf("Retry with Tries 3: %v after %d attempts, want errTransport after 3", err, f.releaseCalls())
		}
		// Jitter: each pause is at most its doubling bound (10, 20, 25, 25
		// ms), and not always the bound itself.
		jitter := Backoff{First: 10 * time.Millisecond, Max: 25 * time.Millisecond, Jitter: true}
		var total time.Duration
		for range 20 {
			f = newFakeStore(errTransport, errTransport, errTransport, errTransport)
			start = time.Now()
			if err := jitter.Retry(context.Background(), f.release); err != nil {
				t.Fatalf("Retry with Jitter: %v", err)
			}
			took := time.Since(start)
			if took > 80*time.Millisecond {
				t.Fatalf("Retry with Jitter took %v, want at most 80ms", took)
			}
			total += took
		}
		if total == 20*80*time.Millisecond {
			t.Errorf("Retry with Jitter paused the full bound every time")
		}
	})
}

// TestGrantUnlockDoneContextSaysSo: an Unlock whose context is done before
// the release is confirmed returns ctx's error even when the background
// attempt answers at once (before Unlock looks: the doc's "an Unlock with a
// cancelled ctx always says so"); the release goes on all the same. The
// race it checks shows under -race (make test): the code before caught 5 of
// 5 runs there, within 2,000 rounds.
func TestGrantUnlockDoneContextSaysSo(t *testing.T) {
	s := newSession()
	defer s.close()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 2000 {
		f := newFakeStore(errTransport) // the first attempt fails; the background one answers at once
		g := f.grant(s)
		if err := g.Unlock(done); !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: Unlock(cancelled ctx) = %v, want context.Canceled", i, err)
		}
		<-g.Finished()
		if n := f.releaseCalls(); n != 2 {
			t.Fatalf("round %d: release called %d times, want 2 (the attempt, then the background)", i, n)
		}
	}
}

// Leadership's Current fails with ErrNotHeld before a win and after the
// leadership ends, and returns the latest win in between.
func TestLeadership(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSession()
		defer s.close()
		f := newFakeStore()
		var l Leadership[*Grant]
		if _, err := l.Current("e"); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Fatalf("Current before a win: %v, want ErrNotHeld", err)
		}
		g := f.grant(s)
		l.Won(g, g)
		if got, err := l.Current("e"); err != nil || got != g {
			t.Fatalf("Current after a win = %v, %v", got, err)
		}
		if err := g.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Current("e"); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Errorf("Current after Unlock: %v, want ErrNotHeld", err)
		}
	})
}
