package conformance

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
)

// testToldBeforeNextGrant: a holder cut off from the store (a partition, not
// a revocation) is told it lost the lock before the waiter already queued
// behind it is granted it, at the deadline its grant reported. While
// connected, the deadline is never later than TTL - Margin from now: it
// counts from the send time of the last acknowledged renewal, minus the
// margin.
func testToldBeforeNextGrant(s *suite) {
	a, fa := s.lockerFaults()
	ga := s.lock(a, "A")

	// The deadline over a renewal period: never beyond now + TTL - Margin,
	// and moved forward by renewals.
	first := ga.Deadline()
	for end := time.Now().Add(s.b.TTL/3 + 200*time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		now := time.Now()
		d := ga.Deadline()
		if limit := now.Add(s.b.TTL - s.b.Margin); d.After(limit.Add(time.Millisecond)) {
			s.t.Fatalf("A: Deadline() is %v from now, more than TTL - Margin (%v): the margin is not applied", d.Sub(now), s.b.TTL-s.b.Margin)
		}
		if !d.After(now) {
			s.t.Fatalf("A: Deadline() %v ago while connected and held", now.Sub(d))
		}
	}
	if !ga.Deadline().After(first) {
		s.t.Errorf("A: Deadline() did not move over %v of renewals (TTL %v)", s.b.TTL/3+200*time.Millisecond, s.b.TTL)
	}

	w := s.locker()
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	n := len(s.keys())
	wres := start(ctx, w, false)
	if ks, ok := s.waitKeys(keyWait, grows(n)); !ok {
		s.t.Fatalf("W's queue key did not appear within %v: keys %q", keyWait, ks)
	}

	var (
		mu       sync.Mutex
		told     time.Time
		deadline time.Time // the grant's own deadline when it was told
	)
	context.AfterFunc(ga.Context(), func() {
		mu.Lock()
		defer mu.Unlock()
		told, deadline = time.Now(), ga.Deadline()
	})
	fa.Cut()
	cut := time.Now()
	r := s.await(wres, s.op+slack, "W: Lock after A was cut off")
	granted := time.Now()
	if r.err != nil {
		s.t.Fatalf("W: Lock after A was cut off: %v", r.err)
	}
	mu.Lock()
	defer mu.Unlock()
	switch {
	case told.IsZero():
		s.t.Fatalf("W was granted the lock %v after A was cut off, and A has not been told", granted.Sub(cut))
	case !told.Before(granted):
		s.t.Errorf("A was told %v after W was granted the lock: it must be told first", told.Sub(granted))
	case told.Before(deadline.Add(-time.Millisecond)):
		s.t.Errorf("A was told %v before its own deadline", deadline.Sub(told))
	case told.After(deadline.Add(promptly)):
		s.t.Errorf("A was told %v after its own deadline, want at most %v", told.Sub(deadline), promptly)
	}
	if cause := context.Cause(ga.Context()); !errors.Is(cause, holdfast.ErrLost) {
		s.t.Errorf("A's cause after the cut: %v, want an error matching holdfast.ErrLost", cause)
	}
	s.t.Logf("A cut off; told %v after the cut, %v before W was granted (W granted %v after the cut)", told.Sub(cut), granted.Sub(told), granted.Sub(cut))
	if r.g.Token() <= ga.Token() {
		s.t.Errorf("W's token %d is not above A's %d", r.g.Token(), ga.Token())
	}
	s.unlock(r.g, "W")
}

// testDeletedKey: an operator deletes the holder's key. The holder is told
// (cause wrapping ErrLost) within LossNotice; another client may take the
// lock meanwhile. The old grant's Unlock then fails with ErrNotHeld and
// touches neither that client's grant nor, once the same locker (the same
// session) has locked the name again, the new grant of its own session.
func testDeletedKey(s *suite) {
	a, b, c := s.locker(), s.locker(), s.locker()
	ga := s.lock(a, "A")
	s.b.Delete(s.t, ga.Key())
	deleted := time.Now()
	gb := s.lock(b, "B after A's key was deleted")
	if !waitDone(ga.Context(), s.b.LossNotice) {
		s.t.Fatalf("A's grant context not done %v after its key was deleted", s.b.LossNotice)
	}
	s.t.Logf("A noticed the deletion of its key after %v", time.Since(deleted))
	if cause := context.Cause(ga.Context()); !errors.Is(cause, holdfast.ErrLost) {
		s.t.Errorf("A's cause after its key was deleted: %v, want an error matching holdfast.ErrLost", cause)
	}
	s.stays(gb, "B, after A noticed its loss")
	if err := s.unlockErr(ga); !errors.Is(err, holdfast.ErrNotHeld) {
		s.t.Errorf("A: Unlock after its key was deleted: %v, want an error matching holdfast.ErrNotHeld", err)
	}
	s.stays(gb, "B, after A's stale Unlock")
	s.expectLocked(c, "C while B holds")
	s.unlock(gb, "B")

	// The same locker, hence the same session, locks the name again: the
	// stale grant must not touch the new one.
	ga2 := s.lock(a, "A again")
	if ga2.Token() <= gb.Token() {
		s.t.Errorf("A's new token %d is not above B's %d", ga2.Token(), gb.Token())
	}
	if err := s.unlockErr(ga); !errors.Is(err, holdfast.ErrNotHeld) {
		s.t.Errorf("A: stale Unlock after A locked again: %v, want an error matching holdfast.ErrNotHeld", err)
	}
	s.stays(ga2, "A's new grant, after the stale Unlock")
	s.expectLocked(c, "C while A holds again")
	s.unlock(ga2, "A again")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after every grant was released: %q", ks)
	}
}

// stays checks, for half a second, that g's key stays in the store and its
// context live.
func (s *suite) stays(g holdfast.Grant, who string) {
	s.t.Helper()
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if ks := s.keys(); !slices.Contains(ks, g.Key()) {
			s.t.Fatalf("%s: key %q is gone: keys %q", who, g.Key(), ks)
		}
		if isDone(g.Context()) {
			s.t.Fatalf("%s: grant context done: %v", who, context.Cause(g.Context()))
		}
	}
}

// testSessionClose: closing a session ends its grants (cause wrapping
// ErrLost and ErrSessionClosed) and removes its keys; its lockers hand out
// nothing more, and others take the lock at once. The session's end comes
// before the context's: a Lock with a done context on a closed session says
// ErrSessionClosed (every store reports the same cause first).
func testSessionClose(s *suite) {
	a, fa := s.lockerFaults()
	b := s.locker()
	ga := s.lock(a, "A")
	fa.Close()
	if !waitDone(ga.Context(), promptly) {
		s.t.Fatalf("A's grant context not done %v after its session was closed", promptly)
	}
	cause := context.Cause(ga.Context())
	if !errors.Is(cause, holdfast.ErrSessionClosed) || !errors.Is(cause, holdfast.ErrLost) {
		s.t.Errorf("A's cause after Close: %v, want an error matching holdfast.ErrSessionClosed and holdfast.ErrLost", cause)
	}
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after A's session was closed: %q", ks)
	}
	ctx, cancel := s.ctx(slack)
	r := s.await(start(ctx, a, false), 2*slack, "A: Lock on a closed session")
	cancel()
	if !errors.Is(r.err, holdfast.ErrSessionClosed) {
		s.t.Errorf("A: Lock on a closed session: grant %s, err %v, want an error matching holdfast.ErrSessionClosed", describe(r.g), r.err)
	}
	done, dcancel := context.WithCancel(s.root)
	dcancel()
	for _, try := range []bool{false, true} {
		r = s.await(start(done, a, try), slack, "A: lock with a done context on a closed session")
		if !errors.Is(r.err, holdfast.ErrSessionClosed) {
			s.t.Errorf("A: try=%v with a done context on a closed session: grant %s, err %v, want an error matching holdfast.ErrSessionClosed (the session first, then the context)", try, describe(r.g), r.err)
		}
	}
	gb := s.tryLock(b, "B after A's session was closed")
	s.unlock(gb, "B")
}

// testBoundedLock: Lock and TryLock return within milliseconds of their
// context ending, even when the store does not answer, and within
// milliseconds of their session's safe deadline when the session is cut off
// while they wait. What they left in the store is removed once it answers
// again.
func testBoundedLock(s *suite) {
	a := s.locker()
	ga := s.lock(a, "A")
	onlyA := s.keys()

	// Short enough that B's session outlives the freeze.
	d := min(time.Second, (s.b.TTL-s.b.Margin)/5)
	b, fb := s.lockerFaults()
	fb.Freeze()
	for _, c := range []struct {
		try bool
		d   time.Duration
	}{{false, d}, {true, d / 2}} {
		ctx, cancel := context.WithTimeout(s.root, c.d)
		r := s.await(start(ctx, b, c.try), c.d+slack, "B: lock on a frozen store")
		cancel()
		switch {
		case r.err == nil:
			s.t.Errorf("B: try=%v on a frozen store while A holds succeeded: %s", c.try, describe(r.g))
		case !errors.Is(r.err, context.DeadlineExceeded) && !errors.Is(r.err, holdfast.ErrLocked):
			s.t.Errorf("B: try=%v on a frozen store: %v, want an error matching context.DeadlineExceeded", c.try, r.err)
		case r.took > c.d+promptly:
			s.t.Errorf("B: try=%v with a %v context on a frozen store returned after %v, want at most %v", c.try, c.d, r.took, c.d+promptly)
		}
	}
	fb.Mend()
	if ks, ok := s.waitKeys(settle, equals(onlyA)); !ok {
		s.t.Errorf("keys %v after the store answered B again: %q, want A's only: %q", settle, ks, onlyA)
	}

	// A waiter whose session is cut off returns at its safe deadline.
	w, fw := s.lockerFaults()
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	wres := start(ctx, w, false)
	if ks, ok := s.waitKeys(keyWait, grows(len(onlyA))); !ok {
		s.t.Fatalf("W's queue key did not appear within %v: keys %q", keyWait, ks)
	}
	fw.Cut()
	cut := time.Now()
	r := s.await(wres, s.b.TTL+slack, "W: Lock after its session was cut off")
	switch {
	case r.err == nil:
		s.t.Errorf("W: Lock succeeded after its session was cut off while A held: %s", describe(r.g))
	case !errors.Is(r.err, holdfast.ErrSessionLost):
		s.t.Errorf("W: Lock after its session was cut off: %v, want an error matching holdfast.ErrSessionLost", r.err)
	case time.Since(cut) > s.b.TTL-s.b.Margin+promptly:
		s.t.Errorf("W: Lock returned %v after its session was cut off, want at most TTL - Margin + %v = %v", time.Since(cut), promptly, s.b.TTL-s.b.Margin+promptly)
	}
	fw.Mend()
	if isDone(ga.Context()) {
		s.t.Errorf("A's grant context done: %v", context.Cause(ga.Context()))
	}
	s.unlock(ga, "A")
}

// testBoundedUnlock: Unlock ends the grant locally at once and returns
// within milliseconds of its context ending, even when the store does not
// answer; the release then goes on in the background, and the same locker
// can lock again once the store answers. Unlock of a lost grant returns at
// once, store or no store.
func testBoundedUnlock(s *suite) {
	a, fa := s.lockerFaults()
	o := s.locker()

	// A frozen store.
	ga := s.lock(a, "A")
	fa.Freeze()
	ctx, cancel := context.WithTimeout(s.root, 500*time.Millisecond)
	t0 := time.Now()
	err := s.unlockWith(ctx, ga)
	took := time.Since(t0)
	cancel()
	switch {
	case !errors.Is(err, context.DeadlineExceeded):
		s.t.Errorf("A: Unlock with a 500ms context on a frozen store: %v, want an error matching context.DeadlineExceeded", err)
	case took > 500*time.Millisecond+promptly:
		s.t.Errorf("A: Unlock with a 500ms context on a frozen store took %v", took)
	}
	if !isDone(ga.Context()) || !errors.Is(context.Cause(ga.Context()), holdfast.ErrReleased) {
		s.t.Errorf("A: grant context after Unlock returned: done %v, cause %v; want it ended with holdfast.ErrReleased", isDone(ga.Context()), context.Cause(ga.Context()))
	}
	t0 = time.Now()
	if err := s.unlockErr(ga); !errors.Is(err, holdfast.ErrNotHeld) || time.Since(t0) > promptly {
		s.t.Errorf("A: second Unlock on a frozen store: %v after %v, want holdfast.ErrNotHeld at once", err, time.Since(t0))
	}
	fa.Mend()
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys %v after the store answered A again: %q, want none: the release must go on in the background", settle, ks)
	}
	ga = s.relock(a, "A, same locker, after its background release")

	// A context already cancelled, the store answering.
	done, cancelDone := context.WithCancel(s.root)
	cancelDone()
	t0 = time.Now()
	_ = s.unlockWith(done, ga)
	if took := time.Since(t0); took > promptly {
		s.t.Errorf("A: Unlock with a cancelled context took %v", took)
	}
	if !errors.Is(context.Cause(ga.Context()), holdfast.ErrReleased) {
		s.t.Errorf("A: cause after Unlock with a cancelled context: %v, want holdfast.ErrReleased", context.Cause(ga.Context()))
	}
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys after Unlock with a cancelled context: %q, want none within %v", ks, settle)
	}
	ga = s.relock(a, "A, same locker, after Unlock with a cancelled context")

	// A lost grant, the store frozen.
	fa.Kill()
	if !waitDone(ga.Context(), s.b.LossNotice) {
		s.t.Fatalf("A's grant context not done %v after its session was killed", s.b.LossNotice)
	}
	fa.Freeze()
	t0 = time.Now()
	err = s.unlockErr(ga)
	if !errors.Is(err, holdfast.ErrNotHeld) || time.Since(t0) > promptly {
		s.t.Errorf("A: Unlock of a lost grant on a frozen store: %v after %v, want holdfast.ErrNotHeld at once", err, time.Since(t0))
	}
	fa.Mend()
	g := s.lock(o, "O after A's session was killed")
	s.unlock(g, "O")
}

// relock takes l with TryLock, retrying while it says ErrLocked for up to
// settle (its earlier grant's release may still be going on in the
// background), and fails the subtest if it cannot.
func (s *suite) relock(l holdfast.Locker, who string) holdfast.Grant {
	s.t.Helper()
	deadline := time.Now().Add(settle)
	for {
		ctx, cancel := s.ctx(s.op)
		r := s.await(start(ctx, l, true), s.op+slack, who+": TryLock")
		cancel()
		switch {
		case r.err == nil:
			return r.g
		case !errors.Is(r.err, holdfast.ErrLocked) || time.Now().After(deadline):
			s.t.Fatalf("%s: TryLock: %v", who, r.err)
		}
		time.Sleep(poll)
	}
}
