package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
)

// semLimit is the limit of the semaphores the Semaphore* properties use.
const semLimit = 3

// semaphore returns a new semaphore of the subtest's name with limit, on a
// session of its own, and its faults.
func (s *suite) semaphore(limit int, opts ...holdfast.LockOption) (holdfast.Locker, Faults) {
	s.t.Helper()
	l, f := s.b.NewSemaphore(s.t, s.name, limit, opts...)
	if l == nil {
		s.t.Fatal("Backend.NewSemaphore returned a nil Locker")
	}
	s.faults(f, "NewSemaphore")
	return l, f
}

// semaphores returns n semaphores of the subtest's name with limit.
func (s *suite) semaphores(n, limit int) []holdfast.Locker {
	s.t.Helper()
	ls := make([]holdfast.Locker, n)
	for i := range ls {
		ls[i], _ = s.semaphore(limit)
	}
	return ls
}

// fill takes limit permits with TryLock, one per locker, and returns them
// and the keys in the store then.
func (s *suite) fill(ls []holdfast.Locker) ([]holdfast.Grant, []string) {
	s.t.Helper()
	gs := make([]holdfast.Grant, len(ls))
	for i, l := range ls {
		gs[i] = s.tryLock(l, fmt.Sprintf("H%d (permit %d of %d)", i, i+1, len(ls)))
		if !s.under(gs[i].Key()) {
			s.t.Errorf("H%d: Key() = %q, want a key under %q", i, gs[i].Key(), s.name+"/")
		}
		if gs[i].Token() == 0 {
			s.t.Errorf("H%d: token 0", i)
		}
	}
	return gs, s.keys()
}

// testSemaphoreLimit: 7 clients with a limit of 3 each take a permit 4
// times and hold it 30 ms. Counted by a fenced counter (a permit counts
// while its context is live), never more than 3 are inside at once, and 3
// are at some point (the semaphore does admit up to its limit); every
// permit has a non-zero token and a key under the name, and its context
// lives while held and ends with ErrReleased on Unlock; nothing is left
// after the last Unlock.
func testSemaphoreLimit(s *suite) {
	const n, k = 7, 4
	ls := s.semaphores(n, semLimit)
	ctx, cancel := s.ctx(2 * s.op)
	defer cancel()
	var (
		occ  = newOccupancy()
		errs errList
		wg   sync.WaitGroup
	)
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range k {
				g, err := l.Lock(ctx)
				if err != nil {
					errs.add("client %d, cycle %d: Lock: %v", i, j, err)
					return
				}
				if g == nil {
					errs.add("client %d, cycle %d: Lock returned a nil Grant and a nil error", i, j)
					return
				}
				if live, who := occ.enter(g, ""); live[""] > semLimit {
					errs.add("client %d, cycle %d: %d live permits at once with a limit of %d: %v", i, j, live[""], semLimit, who)
				}
				if g.Token() == 0 || !s.under(g.Key()) {
					errs.add("client %d, cycle %d: permit %s: want a non-zero token and a key under %q", i, j, describe(g), s.name+"/")
				}
				time.Sleep(30 * time.Millisecond)
				if err := g.Context().Err(); err != nil {
					errs.add("client %d, cycle %d: permit context done while held: %v", i, j, context.Cause(g.Context()))
				}
				occ.leave(g)
				uctx, ucancel := context.WithTimeout(ctx, s.op)
				err = g.Unlock(uctx)
				ucancel()
				if err != nil {
					errs.add("client %d, cycle %d: Unlock: %v", i, j, err)
					return
				}
				if !errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) {
					errs.add("client %d, cycle %d: permit context cause after Unlock: %v, want holdfast.ErrReleased", i, j, context.Cause(g.Context()))
				}
			}
		}()
	}
	finished := waitGroup(&wg, 2*s.op+slack)
	errs.report(s.t)
	if !finished {
		s.t.Fatalf("clients did not finish within %v", 2*s.op+slack)
	}
	if m := occ.most(""); m < semLimit {
		s.t.Errorf("at most %d permits held at once by %d clients holding 30 ms each, want %d: the semaphore does not admit up to its limit", m, n, semLimit)
	}
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every permit was released: %q", ks)
	}
}

// testSemaphoreTryLock: with the limit reached, TryLock fails at once with
// ErrLocked and writes nothing, and Lock waits; after one release, TryLock
// by another client succeeds.
func testSemaphoreTryLock(s *suite) {
	ls := s.semaphores(semLimit+2, semLimit)
	gs, full := s.fill(ls[:semLimit])
	x := ls[semLimit]

	ctx, cancel := s.ctx(2 * time.Second)
	r := s.await(start(ctx, x, true), 2*time.Second+slack, "X: TryLock on a full semaphore")
	cancel()
	switch {
	case r.err == nil:
		s.t.Errorf("X: TryLock with %d of %d permits taken succeeded: %s", semLimit, semLimit, describe(r.g))
	case !errors.Is(r.err, holdfast.ErrLocked):
		s.t.Errorf("X: TryLock on a full semaphore: %v, want an error matching holdfast.ErrLocked", r.err)
	case r.took >= 2*time.Second:
		s.t.Errorf("X: TryLock on a full semaphore took %v, want it to fail at once", r.took)
	}
	if ks := s.keys(); !slices.Equal(ks, full) {
		s.t.Errorf("keys after a failed TryLock: %q, want them unchanged: %q", ks, full)
	}
	ctx, cancel = context.WithTimeout(s.root, 300*time.Millisecond)
	r = s.await(start(ctx, x, false), 300*time.Millisecond+slack, "X: Lock on a full semaphore")
	cancel()
	if r.err == nil {
		s.t.Errorf("X: Lock with %d of %d permits taken succeeded: %s", semLimit, semLimit, describe(r.g))
	}
	for i, g := range gs {
		if isDone(g.Context()) {
			s.t.Errorf("H%d: permit context done after X's attempts: %v", i, context.Cause(g.Context()))
		}
	}
	s.unlock(gs[0], "H0")
	gy := s.relock(ls[semLimit+1], "Y after H0's release")
	s.unlock(gy, "Y")
	for i, g := range gs[1:] {
		s.unlock(g, fmt.Sprintf("H%d", i+1))
	}
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every permit was released: %q", ks)
	}
}

// testSemaphoreKilledHolder: with the limit reached and W waiting, H0's
// session is killed: H0's permit context ends (cause wrapping ErrLost)
// within LossNotice, W gets the permit back within OpTimeout, the other
// holders keep theirs, and H0's late Unlock fails with ErrNotHeld.
func testSemaphoreKilledHolder(s *suite) {
	ls := make([]holdfast.Locker, semLimit)
	var f0 Faults
	ls[0], f0 = s.semaphore(semLimit)
	for i := 1; i < semLimit; i++ {
		ls[i], _ = s.semaphore(semLimit)
	}
	w, _ := s.semaphore(semLimit)
	gs, full := s.fill(ls)

	ctx, cancel := s.ctx(s.op)
	defer cancel()
	wres := start(ctx, w, false)
	if ks, ok := s.waitKeys(keyWait, grows(len(full))); !ok {
		s.t.Fatalf("W's key did not appear within %v: keys %q", keyWait, ks)
	}
	s.waiting(wres, "W: Lock on a full semaphore")
	f0.Kill()
	killed := time.Now()
	if !waitDone(gs[0].Context(), s.b.LossNotice) {
		s.t.Errorf("H0's permit context not done %v after its session was killed", s.b.LossNotice)
	} else if cause := context.Cause(gs[0].Context()); !errors.Is(cause, holdfast.ErrLost) {
		s.t.Errorf("H0's cause after its session was killed: %v, want an error matching holdfast.ErrLost", cause)
	}
	r := s.await(wres, s.op+slack, "W: Lock after H0's session was killed")
	if r.err != nil {
		s.t.Fatalf("W: Lock after H0's session was killed: %v, want the permit back within %v", r.err, s.op)
	}
	s.t.Logf("W got H0's permit %v after H0's session was killed", time.Since(killed))
	for i, g := range gs[1:] {
		if isDone(g.Context()) {
			s.t.Errorf("H%d: permit context done after H0's session was killed: %v", i+1, context.Cause(g.Context()))
		}
	}
	if err := s.unlockErr(gs[0]); !errors.Is(err, holdfast.ErrNotHeld) {
		s.t.Errorf("H0: Unlock after its session was killed: %v, want an error matching holdfast.ErrNotHeld", err)
	}
	if isDone(r.g.Context()) {
		s.t.Errorf("W: permit context done after H0's late Unlock: %v", context.Cause(r.g.Context()))
	}
	s.unlock(r.g, "W")
	for i, g := range gs[1:] {
		s.unlock(g, fmt.Sprintf("H%d", i+1))
	}
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every permit was released: %q", ks)
	}
}

// testSemaphoreCancelCleanup: with the limit reached, a waiter cancelled
// after ~200 ms gets context.Canceled, one with a 300 ms deadline gets
// context.DeadlineExceeded, one whose context is already cancelled fails
// at once; what they wrote is gone within settle, and the holders keep
// their permits.
func testSemaphoreCancelCleanup(s *suite) {
	ls := s.semaphores(semLimit+3, semLimit)
	gs, full := s.fill(ls[:semLimit])
	b, c, d := ls[semLimit], ls[semLimit+1], ls[semLimit+2]

	bctx, bcancel := context.WithCancel(s.root)
	defer bcancel()
	t0 := time.Now()
	bres := start(bctx, b, false)
	if ks, ok := s.waitKeys(keyWait, grows(len(full))); !ok {
		s.t.Fatalf("B's key did not appear within %v: keys %q", keyWait, ks)
	}
	time.Sleep(200*time.Millisecond - time.Since(t0))
	s.waiting(bres, "B: Lock on a full semaphore")
	bcancel()
	r := s.await(bres, slack, "B: Lock after its context was cancelled")
	if r.err == nil || !errors.Is(r.err, context.Canceled) {
		s.t.Errorf("B: Lock on a full semaphore, cancelled: grant %s, err %v, want an error matching context.Canceled", describe(r.g), r.err)
	}
	if ks, ok := s.waitKeys(settle, equals(full)); !ok {
		s.t.Fatalf("keys %v after B's cancelled Lock returned: %q, want the holders' only: %q (left behind: %q)", settle, ks, full, without(ks, full))
	}

	cctx, ccancel := context.WithTimeout(s.root, 300*time.Millisecond)
	defer ccancel()
	r = s.await(start(cctx, c, false), 300*time.Millisecond+slack, "C: Lock with a 300 ms deadline")
	if r.err == nil || !errors.Is(r.err, context.DeadlineExceeded) {
		s.t.Errorf("C: Lock on a full semaphore past its deadline: grant %s, err %v, want an error matching context.DeadlineExceeded", describe(r.g), r.err)
	}
	if ks, ok := s.waitKeys(settle, equals(full)); !ok {
		s.t.Fatalf("keys %v after C's Lock hit its deadline: %q, want the holders' only: %q (left behind: %q)", settle, ks, full, without(ks, full))
	}

	dctx, dcancel := context.WithCancel(s.root)
	dcancel()
	r = s.await(start(dctx, d, false), slack, "D: Lock with an already-cancelled context")
	if r.err == nil || !errors.Is(r.err, context.Canceled) {
		s.t.Errorf("D: Lock with an already-cancelled context: grant %s, err %v, want an error matching context.Canceled", describe(r.g), r.err)
	}
	if ks := s.keys(); !slices.Equal(ks, full) {
		s.t.Errorf("keys after D's Lock with a cancelled context: %q, want the holders' only: %q", ks, full)
	}
	for i, g := range gs {
		if isDone(g.Context()) {
			s.t.Errorf("H%d: permit context done after the waiters gave up: %v", i, context.Cause(g.Context()))
		}
		s.unlock(g, fmt.Sprintf("H%d", i))
	}
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every permit was released: %q", ks)
	}
}

// testSemaphoreLimitMismatch: while A holds a permit of a semaphore with a
// limit of 3, clients that say 4 (TryLock) and 2 (Lock) fail at once with
// an error wrapping ErrConflict, write nothing, and leave A's permit alone:
// never over-admission, never a silent wait.
func testSemaphoreLimitMismatch(s *suite) {
	a, _ := s.semaphore(semLimit)
	ga := s.tryLock(a, "A (limit 3)")
	before := s.keys()
	for _, c := range []struct {
		limit int
		try   bool
	}{{semLimit + 1, true}, {semLimit - 1, false}} {
		x, _ := s.semaphore(c.limit)
		ctx, cancel := s.ctx(s.op)
		r := s.await(start(ctx, x, c.try), s.op+slack, fmt.Sprintf("X (limit %d): lock", c.limit))
		cancel()
		switch {
		case r.err == nil:
			s.t.Errorf("X: try=%v with a limit of %d while A holds with %d succeeded: %s", c.try, c.limit, semLimit, describe(r.g))
			s.unlock(r.g, "X")
		case !errors.Is(r.err, holdfast.ErrConflict):
			s.t.Errorf("X: try=%v with a limit of %d while A holds with %d: %v, want an error matching holdfast.ErrConflict", c.try, c.limit, semLimit, r.err)
		case r.took > slack:
			s.t.Errorf("X: try=%v took %v to report the limit mismatch, want it at once", c.try, r.took)
		}
	}
	if ks, ok := s.waitKeys(settle, equals(before)); !ok {
		s.t.Errorf("keys after the mismatched locks: %q, want them unchanged: %q", ks, before)
	}
	if isDone(ga.Context()) {
		s.t.Errorf("A: permit context done after the mismatched locks: %v", context.Cause(ga.Context()))
	}
	s.unlock(ga, "A")
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after A's release: %q", ks)
	}
}

// promptRounds is how many times PromptAdmission lets contenders join
// together, with and without a holder already in.
const promptRounds = 8

// testSemaphorePromptAdmission: contenders that fit under the limit and
// join together are all granted at once, none waiting for a release that
// they do not need: 3 clients at once on a free semaphore with a limit of
// 3, and 2 at once beside a holder, each 8 times.
func testSemaphorePromptAdmission(s *suite) {
	ls := s.semaphores(semLimit+1, semLimit)
	s.promptAdmission(ls[semLimit], ls[:semLimit], "permit")
}

// promptAdmission is PromptAdmission on lockers that all fit at once: in
// each round, the contenders (all of ls; all but one when holder is in
// first) call Lock at the same moment, and each must be granted within
// admitWithin of its call.
func (s *suite) promptAdmission(holder holdfast.Locker, ls []holdfast.Locker, what string) {
	s.t.Helper()
	for round := range 2 * promptRounds {
		withHolder := round%2 == 1
		var gh holdfast.Grant
		contenders := ls
		if withHolder {
			gh = s.tryLock(holder, fmt.Sprintf("round %d: H", round))
			contenders = ls[1:]
		}
		ctx, cancel := s.ctx(admitWithin + slack)
		gate := make(chan struct{})
		chs := make([]<-chan result, len(contenders))
		for i, l := range contenders {
			ch := make(chan result, 1)
			chs[i] = ch
			go func() {
				<-gate
				ch <- <-start(ctx, l, false)
			}()
		}
		close(gate)
		var late []string
		var gs []holdfast.Grant
		for i, ch := range chs {
			r := s.await(ch, admitWithin+2*slack, fmt.Sprintf("round %d: C%d: Lock", round, i))
			switch {
			case r.err != nil:
				late = append(late, fmt.Sprintf("C%d failed after %v: %v", i, r.took.Round(time.Millisecond), r.err))
			case r.took > admitWithin:
				late = append(late, fmt.Sprintf("C%d granted after %v", i, r.took.Round(time.Millisecond)))
				gs = append(gs, r.g)
			default:
				gs = append(gs, r.g)
			}
		}
		cancel()
		if len(late) > 0 {
			s.t.Errorf("round %d (holder in first: %v): %d contenders that fit joined together, want each granted a %s within %v: %s",
				round, withHolder, len(contenders), what, admitWithin, strings.Join(late, "; "))
		}
		for i, g := range gs {
			s.unlock(g, fmt.Sprintf("round %d: C%d", round, i))
		}
		if gh != nil {
			s.unlock(gh, fmt.Sprintf("round %d: H", round))
		}
		if s.t.Failed() {
			return
		}
	}
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every %s was released: %q", what, ks)
	}
}

// testSemaphoreReentrancy: WithReentrant means on a semaphore what it means
// on a lock: R, reentrant, takes a permit of a semaphore with a limit of 2
// and locks again at once, getting the same key and token and no second
// permit (O1 takes the last permit, and O2 finds none); R's permit is
// released by the Unlock that matches its first Lock (after which O2 gets
// it), and a third Unlock fails with ErrNotHeld.
func testSemaphoreReentrancy(s *suite) {
	const limit = 2
	r, _ := s.semaphore(limit, holdfast.WithReentrant())
	o1, _ := s.semaphore(limit)
	o2, _ := s.semaphore(limit)
	g1 := s.lock(r, "R (reentrant), first Lock")
	ctx, cancel := s.ctx(2 * time.Second)
	res := s.await(start(ctx, r, false), 2*time.Second+slack, "R: second (reentrant) Lock")
	cancel()
	if res.err != nil {
		s.t.Fatalf("R: second Lock on a reentrant semaphore that holds a permit: %v, want it to succeed at once", res.err)
	}
	g2 := res.g
	if g2.Token() != g1.Token() || g2.Key() != g1.Key() {
		s.t.Errorf("R: reentrant Lock returned %s, want the same key and token as %s", describe(g2), describe(g1))
	}
	gO1 := s.tryLock(o1, "O1 beside R (one permit of 2 left)")
	s.expectLocked(o2, "O2 while R (twice) and O1 hold")
	s.unlock(g2, "R, first Unlock")
	if isDone(g1.Context()) {
		s.t.Errorf("R: permit context done after the first of two Unlocks: %v", context.Cause(g1.Context()))
	}
	s.expectLocked(o2, "O2 while R still holds once")
	s.unlock(g1, "R, second Unlock")
	if !errors.Is(context.Cause(g1.Context()), holdfast.ErrReleased) {
		s.t.Errorf("R: permit context cause after the last Unlock: %v, want holdfast.ErrReleased", context.Cause(g1.Context()))
	}
	gO2 := s.relock(o2, "O2 after R's last Unlock")
	if err := s.unlockErr(g1); !errors.Is(err, holdfast.ErrNotHeld) {
		s.t.Errorf("R: third Unlock: %v, want an error matching holdfast.ErrNotHeld", err)
	}
	if isDone(gO2.Context()) {
		s.t.Errorf("O2's permit context done after R's third Unlock: %v", context.Cause(gO2.Context()))
	}
	s.unlock(gO1, "O1")
	s.unlock(gO2, "O2")
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every permit was released: %q", ks)
	}
}
