package conformance

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast"
)

// testMutualExclusion: 8 lockers on sessions of their own each take the
// lock 10 times. Nobody may be inside at the same time as anybody else,
// every write through a Fence with the grant's token must be admitted,
// tokens of successive grants must strictly increase, and every Unlock must
// succeed.
func testMutualExclusion(s *suite) {
	const n, k = 8, 10
	lockers := make([]holdfast.Locker, n)
	for i := range lockers {
		lockers[i] = s.locker()
	}
	ctx, cancel := s.ctx(2 * s.op)
	defer cancel()

	var (
		fence    holdfast.Fence
		writes   int // under fence
		inside   atomic.Int32
		overlaps atomic.Int32
		mu       sync.Mutex
		tokens   []holdfast.Token // grant order
		regress  []string
		errs     errList
		wg       sync.WaitGroup
	)
	for i, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range k {
				g, err := l.Lock(ctx)
				if err != nil {
					errs.add("locker %d, cycle %d: Lock: %v", i, j, err)
					return
				}
				if g == nil {
					errs.add("locker %d, cycle %d: Lock returned a nil Grant and a nil error", i, j)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				tok := g.Token()
				mu.Lock()
				if last := len(tokens) - 1; last >= 0 && tok <= tokens[last] {
					regress = append(regress, tok.String()+" after "+tokens[last].String())
				}
				tokens = append(tokens, tok)
				mu.Unlock()
				if err := fence.Do(tok, func() { writes++ }); err != nil {
					errs.add("locker %d, cycle %d: write under token %d refused by the fence: %v", i, j, tok, err)
				}
				if err := g.Context().Err(); err != nil {
					errs.add("locker %d, cycle %d: grant context done while held: %v", i, j, context.Cause(g.Context()))
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				uctx, ucancel := context.WithTimeout(ctx, s.op)
				err = g.Unlock(uctx)
				ucancel()
				if err != nil {
					errs.add("locker %d, cycle %d: Unlock: %v", i, j, err)
					return
				}
			}
		}()
	}
	finished := waitGroup(&wg, 2*s.op+slack)
	errs.report(s.t)
	if !finished {
		s.t.Fatalf("lockers did not finish within %v", 2*s.op+slack)
	}
	if o := overlaps.Load(); o != 0 {
		s.t.Errorf("%d times a locker got the lock while another was inside", o)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(regress) != 0 {
		s.t.Errorf("tokens of successive grants did not strictly increase: %v (grant order: %v)", regress, tokens)
	}
	if len(tokens) != n*k {
		s.t.Errorf("%d grants, want %d", len(tokens), n*k)
	}
	if got := fence.Max(); writes != n*k || (len(tokens) > 0 && got != slices.Max(tokens)) {
		s.t.Errorf("fence admitted %d writes (highest token %d), want %d", writes, got, n*k)
	}
}

// testFIFO: while A holds, W1..W5 queue one after another (each only once
// the previous one's key is in the store); after A's release they must be
// granted in that order.
func testFIFO(s *suite) {
	const n = 5
	ga := s.lock(s.locker(), "A")
	prev := len(s.keys())
	ctx, cancel := s.ctx(s.op)
	defer cancel()

	var (
		mu    sync.Mutex
		order []int
		errs  errList
		wg    sync.WaitGroup
	)
	granted := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(order)
	}
	for i := 1; i <= n; i++ {
		w := s.locker()
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := w.Lock(ctx)
			if err != nil {
				errs.add("W%d: Lock: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			uctx, ucancel := context.WithTimeout(ctx, s.op)
			defer ucancel()
			if err := g.Unlock(uctx); err != nil {
				errs.add("W%d: Unlock: %v", i, err)
			}
		}()
		ks, ok := s.waitKeys(keyWait, func(ks []string) bool { return len(ks) > prev || len(granted()) > 0 })
		if g := granted(); len(g) > 0 {
			errs.report(s.t)
			s.t.Fatalf("waiters %v were granted the lock while A held it", g)
		}
		if !ok {
			errs.report(s.t)
			s.t.Fatalf("W%d's queue key did not appear within %v: keys %q", i, keyWait, ks)
		}
		prev = len(ks)
	}
	s.unlock(ga, "A")
	finished := waitGroup(&wg, s.op+slack)
	errs.report(s.t)
	if !finished {
		s.t.Fatalf("waiters did not all get the lock within %v after A's release; granted so far: %v", s.op+slack, granted())
	}
	if want := []int{1, 2, 3, 4, 5}; !slices.Equal(order, want) {
		s.t.Errorf("grant order %v, want %v (first come, first served)", order, want)
	}
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after every waiter unlocked: %q", ks)
	}
}

// testTryLock: TryLock takes a free lock; on a held lock it fails at once
// with ErrLocked and leaves no key; after the release it succeeds again.
func testTryLock(s *suite) {
	l1, l2 := s.locker(), s.locker()
	g1 := s.tryLock(l1, "L1 on a free lock")
	before := s.keys()

	ctx, cancel := s.ctx(2 * time.Second)
	r := s.await(start(ctx, l2, true), 2*time.Second+slack, "L2: TryLock on a held lock")
	cancel()
	switch {
	case r.err == nil:
		s.t.Errorf("L2: TryLock on a lock held by L1 succeeded: %s", describe(r.g))
	case !errors.Is(r.err, holdfast.ErrLocked):
		s.t.Errorf("L2: TryLock on a held lock: %v, want an error matching holdfast.ErrLocked", r.err)
	}
	if r.took >= 2*time.Second {
		s.t.Errorf("L2: TryLock on a held lock took %v, want it to fail at once", r.took)
	}
	if after := s.keys(); !slices.Equal(after, before) {
		s.t.Errorf("keys after a failed TryLock: %q, want them unchanged: %q", after, before)
	}
	if isDone(g1.Context()) {
		s.t.Errorf("L1's grant context done after another locker's TryLock: %v", context.Cause(g1.Context()))
	}
	s.unlock(g1, "L1")
	g2 := s.tryLock(l2, "L2 after L1's release")

	// No barging: W queues behind L2, its traffic frozen so that it cannot
	// take its turn yet; after L2's release, W is next in line, and TryLock
	// by anyone else fails until W is done.
	w, fw := s.lockerFaults()
	ctx, cancel = s.ctx(s.op)
	defer cancel()
	n := len(s.keys())
	wres := start(ctx, w, false)
	if ks, ok := s.waitKeys(keyWait, grows(n)); !ok {
		s.t.Fatalf("W's queue key did not appear within %v: keys %q", keyWait, ks)
	}
	fw.Freeze()
	s.unlock(g2, "L2")
	s.expectLocked(l1, "L1 while W, frozen, is next in line")
	fw.Mend()
	r = s.await(wres, s.op+slack, "W: Lock after L2's release")
	if r.err != nil {
		s.t.Fatalf("W: Lock after L2's release: %v", r.err)
	}
	s.unlock(r.g, "W")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after every grant was released: %q", ks)
	}
}

// testCancelCleanup: while A holds, a waiter cancelled after ~200 ms gets
// context.Canceled, a waiter with a 300 ms deadline gets
// context.DeadlineExceeded, a Lock whose context is already cancelled fails;
// none of them leaves a key (what they wrote is removed within settle).
// After A's release no key is left at all, and a Lock with an
// already-cancelled context on the free lock fails too.
func testCancelCleanup(s *suite) {
	a, b, c, d := s.locker(), s.locker(), s.locker(), s.locker()
	ga := s.lock(a, "A")
	onlyA := s.keys()

	// B: cancelled while queued.
	bctx, bcancel := context.WithCancel(s.root)
	defer bcancel()
	t0 := time.Now()
	bres := start(bctx, b, false)
	if ks, ok := s.waitKeys(keyWait, grows(len(onlyA))); !ok {
		s.t.Fatalf("B's queue key did not appear within %v: keys %q", keyWait, ks)
	}
	time.Sleep(200*time.Millisecond - time.Since(t0))
	r, returned := s.early(bres, "B: Lock on a held lock")
	bcancel()
	if !returned {
		r = s.await(bres, slack, "B: Lock after its context was cancelled")
	}
	switch {
	case r.err == nil:
		s.t.Errorf("B: Lock succeeded while A held the lock: %s", describe(r.g))
	case !errors.Is(r.err, context.Canceled):
		s.t.Errorf("B: Lock with a cancelled context: %v, want an error matching context.Canceled", r.err)
	}
	if ks, ok := s.waitKeys(settle, equals(onlyA)); !ok {
		s.t.Fatalf("keys %v after B's cancelled Lock returned: %q, want A's only: %q (left behind: %q)", settle, ks, onlyA, without(ks, onlyA))
	}

	// C: deadline while queued.
	cctx, ccancel := context.WithTimeout(s.root, 300*time.Millisecond)
	defer ccancel()
	r = s.await(start(cctx, c, false), 300*time.Millisecond+slack, "C: Lock with a 300 ms deadline")
	switch {
	case r.err == nil:
		s.t.Errorf("C: Lock succeeded while A held the lock: %s", describe(r.g))
	case !errors.Is(r.err, context.DeadlineExceeded):
		s.t.Errorf("C: Lock past its deadline: %v, want an error matching context.DeadlineExceeded", r.err)
	}
	if ks, ok := s.waitKeys(settle, equals(onlyA)); !ok {
		s.t.Errorf("keys %v after C's Lock hit its deadline: %q, want A's only: %q (left behind: %q)", settle, ks, onlyA, without(ks, onlyA))
	}

	// D: context cancelled before the call, lock held.
	dctx, dcancel := context.WithCancel(s.root)
	dcancel()
	r = s.await(start(dctx, d, false), slack, "D: Lock with an already-cancelled context")
	switch {
	case r.err == nil:
		s.t.Errorf("D: Lock with an already-cancelled context succeeded while A held the lock: %s", describe(r.g))
	case !errors.Is(r.err, context.Canceled):
		s.t.Errorf("D: Lock with an already-cancelled context: %v, want an error matching context.Canceled", r.err)
	}
	if ks := s.keys(); !slices.Equal(ks, onlyA) {
		s.t.Errorf("keys after D's Lock with a cancelled context: %q, want A's only: %q", ks, onlyA)
	}
	if isDone(ga.Context()) {
		s.t.Errorf("A's grant context done after other lockers gave up: %v", context.Cause(ga.Context()))
	}

	s.unlock(ga, "A")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Fatalf("keys left %v after A, the only holder, unlocked: %q", settle, ks)
	}

	// E: context cancelled before the call, lock free.
	e := s.locker()
	r = s.await(start(dctx, e, false), slack, "E: Lock on a free lock with an already-cancelled context")
	switch {
	case r.err == nil:
		s.t.Errorf("E: Lock with an already-cancelled context succeeded: %s", describe(r.g))
		s.unlock(r.g, "E")
	case !errors.Is(r.err, context.Canceled):
		s.t.Errorf("E: Lock on a free lock with an already-cancelled context: %v, want an error matching context.Canceled", r.err)
	}
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys after E's Lock with a cancelled context on a free lock: %q, want none", ks)
	}
}

// testMonotonicTokens: 20 Lock/Unlock cycles of one locker: tokens are
// non-zero and strictly increase; the key is under the lock name and in the
// store; the grant context lives while held and ends with ErrReleased.
func testMonotonicTokens(s *suite) {
	l := s.locker()
	var prev holdfast.Token
	for i := range 20 {
		g := s.lock(l, "cycle "+strconv.Itoa(i))
		tok := g.Token()
		switch {
		case tok == 0:
			s.t.Errorf("cycle %d: token 0", i)
		case i > 0 && tok <= prev:
			s.t.Errorf("cycle %d: token %d after %d, want it to strictly increase", i, tok, prev)
		}
		prev = tok
		if !s.under(g.Key()) {
			s.t.Errorf("cycle %d: Key() = %q, want a key under %q", i, g.Key(), s.name+"/")
		}
		if i == 0 || i == 19 {
			if ks := s.keys(); !slices.Contains(ks, g.Key()) {
				s.t.Errorf("cycle %d: the grant's key %q is not in the store: %q", i, g.Key(), ks)
			}
		}
		ctx := g.Context()
		if ctx == nil {
			s.t.Fatalf("cycle %d: Context() is nil", i)
		}
		if isDone(ctx) {
			s.t.Errorf("cycle %d: grant context done while held: %v", i, context.Cause(ctx))
		}
		s.unlock(g, "cycle "+strconv.Itoa(i))
		switch {
		case !isDone(ctx):
			s.t.Errorf("cycle %d: grant context not done after Unlock returned", i)
		case !errors.Is(context.Cause(ctx), holdfast.ErrReleased):
			s.t.Errorf("cycle %d: grant context cause after Unlock: %v, want holdfast.ErrReleased", i, context.Cause(ctx))
		}
	}
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after the last Unlock: %q", ks)
	}
}

// testLossNotice: when A's session is killed from outside, A's grant
// context ends within LossNotice with a cause wrapping ErrLost; B then gets
// the lock with a higher token; A's late Unlock fails with ErrNotHeld and
// touches nothing of B's.
func testLossNotice(s *suite) {
	a, fa := s.lockerFaults()
	killA := fa.Kill
	b, c := s.locker(), s.locker()
	ga := s.lock(a, "A")
	actx := ga.Context()

	t0 := time.Now()
	killA()
	killed := time.Now()
	if !waitDone(actx, s.b.LossNotice) {
		s.t.Fatalf("A's grant context not done %v after its session was killed (kill took %v)", s.b.LossNotice, killed.Sub(t0))
	}
	s.t.Logf("A noticed the loss %v after kill() returned (kill took %v)", time.Since(killed), killed.Sub(t0))
	if cause := context.Cause(actx); !errors.Is(cause, holdfast.ErrLost) {
		s.t.Errorf("A's grant context cause after its session was killed: %v, want an error matching holdfast.ErrLost", cause)
	}

	gb := s.lock(b, "B after A's session was killed")
	if gb.Token() <= ga.Token() {
		s.t.Errorf("B's token %d is not above A's %d", gb.Token(), ga.Token())
	}
	if err := s.unlockErr(ga); !errors.Is(err, holdfast.ErrNotHeld) {
		s.t.Errorf("A: Unlock after its grant was lost: %v, want an error matching holdfast.ErrNotHeld", err)
	}
	if ks := s.keys(); !slices.Contains(ks, gb.Key()) {
		s.t.Errorf("B's key %q is gone after A's late Unlock: keys %q", gb.Key(), ks)
	}
	if isDone(gb.Context()) {
		s.t.Errorf("B's grant context done after A's late Unlock: %v", context.Cause(gb.Context()))
	}
	s.expectLocked(c, "C while B holds (after A's late Unlock)")
	s.unlock(gb, "B")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after B unlocked: %q", ks)
	}
}

// testDoubleUnlock: A's second Unlock fails with ErrNotHeld, and does not
// touch C, who took the lock in between.
func testDoubleUnlock(s *suite) {
	a, c, d := s.locker(), s.locker(), s.locker()
	ga := s.lock(a, "A")
	s.unlock(ga, "A")
	gc := s.lock(c, "C after A's Unlock")
	if err := s.unlockErr(ga); !errors.Is(err, holdfast.ErrNotHeld) {
		s.t.Errorf("A: second Unlock: %v, want an error matching holdfast.ErrNotHeld", err)
	}
	if ks := s.keys(); !slices.Contains(ks, gc.Key()) {
		s.t.Errorf("C's key %q is gone after A's second Unlock: keys %q", gc.Key(), ks)
	}
	if isDone(gc.Context()) {
		s.t.Errorf("C's grant context done after A's second Unlock: %v", context.Cause(gc.Context()))
	}
	s.expectLocked(d, "D while C holds (after A's second Unlock)")
	s.unlock(gc, "C")
	if err := s.unlockErr(gc); !errors.Is(err, holdfast.ErrNotHeld) {
		s.t.Errorf("C: second Unlock: %v, want an error matching holdfast.ErrNotHeld", err)
	}
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after C unlocked: %q", ks)
	}
}

// testReentrancy: with WithReentrant the same Locker locks twice without
// blocking and gets the same key and token; the grant is released by the
// second Unlock, and a third fails with ErrNotHeld without touching the next
// holder. Without it, a second Lock through the same Locker waits like any
// other contender and leaves no key when it gives up.
func testReentrancy(s *suite) {
	r, o := s.locker(holdfast.WithReentrant()), s.locker()
	g1 := s.lock(r, "R (reentrant), first Lock")
	ctx, cancel := s.ctx(2 * time.Second)
	res := s.await(start(ctx, r, false), 2*time.Second+slack, "R: second (reentrant) Lock")
	cancel()
	if res.err != nil {
		s.t.Fatalf("R: second Lock on a reentrant Locker that holds the lock: %v, want it to succeed at once", res.err)
	}
	g2 := res.g
	if g2.Token() != g1.Token() || g2.Key() != g1.Key() {
		s.t.Errorf("R: reentrant Lock returned %s, want the same key and token as %s", describe(g2), describe(g1))
	}
	s.expectLocked(o, "O while R holds twice")

	s.unlock(g2, "R, first Unlock")
	if isDone(g1.Context()) {
		s.t.Errorf("R: grant context done after the first of two Unlocks: %v", context.Cause(g1.Context()))
	}
	s.expectLocked(o, "O while R still holds once")

	s.unlock(g1, "R, second Unlock")
	switch {
	case !isDone(g1.Context()):
		s.t.Errorf("R: grant context not done after the last Unlock")
	case !errors.Is(context.Cause(g1.Context()), holdfast.ErrReleased):
		s.t.Errorf("R: grant context cause after the last Unlock: %v, want holdfast.ErrReleased", context.Cause(g1.Context()))
	}
	gO := s.tryLock(o, "O after R's last Unlock")
	if err := s.unlockErr(g1); !errors.Is(err, holdfast.ErrNotHeld) {
		s.t.Errorf("R: third Unlock: %v, want an error matching holdfast.ErrNotHeld", err)
	}
	if ks := s.keys(); !slices.Contains(ks, gO.Key()) {
		s.t.Errorf("O's key %q is gone after R's third Unlock: keys %q", gO.Key(), ks)
	}
	if isDone(gO.Context()) {
		s.t.Errorf("O's grant context done after R's third Unlock: %v", context.Cause(gO.Context()))
	}
	s.expectLocked(r, "R (reentrant, released) while O holds")
	s.unlock(gO, "O")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Fatalf("keys left after every reentrant grant was released: %q", ks)
	}

	// Not reentrant: a second Lock through the same Locker blocks.
	n := s.locker()
	gn := s.lock(n, "N (not reentrant)")
	before := s.keys()
	ctx, cancel = context.WithTimeout(s.root, 300*time.Millisecond)
	res = s.await(start(ctx, n, false), 300*time.Millisecond+slack, "N: second Lock (not reentrant)")
	cancel()
	switch {
	case res.err == nil:
		s.t.Errorf("N: second Lock on a non-reentrant Locker that holds the lock returned %s, want it to block", describe(res.g))
	case !errors.Is(res.err, context.DeadlineExceeded):
		s.t.Errorf("N: second Lock on a non-reentrant Locker: %v, want it to block until its deadline (context.DeadlineExceeded)", res.err)
	}
	if ks := s.keys(); !slices.Equal(ks, before) {
		s.t.Errorf("keys after N's second Lock gave up: %q, want them unchanged: %q", ks, before)
	}
	if isDone(gn.Context()) {
		s.t.Errorf("N: grant context done after its second Lock gave up: %v", context.Cause(gn.Context()))
	}
	s.unlock(gn, "N")
	gn = s.lock(n, "N again after its Unlock")
	s.unlock(gn, "N again")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after N unlocked: %q", ks)
	}
}

// testContextWhileWaiting: a waiter whose session is killed while it waits
// returns promptly with ErrSessionLost (or ErrLost), leaves no key, and its
// Locker hands out no more grants; the holder is not affected.
func testContextWhileWaiting(s *suite) {
	a := s.locker()
	w, fw := s.lockerFaults()
	killW := fw.Kill
	ga := s.lock(a, "A")
	onlyA := s.keys()

	ctx, cancel := s.ctx(s.op)
	defer cancel()
	wres := start(ctx, w, false)
	if ks, ok := s.waitKeys(keyWait, grows(len(onlyA))); !ok {
		s.t.Fatalf("W's queue key did not appear within %v: keys %q", keyWait, ks)
	}
	r, returned := s.early(wres, "W: Lock on a held lock")
	killW()
	if !returned {
		r = s.await(wres, s.b.LossNotice+slack, "W: Lock after its session was killed")
	}
	switch {
	case r.err == nil:
		s.t.Errorf("W: Lock succeeded after its session was killed while A held the lock: %s", describe(r.g))
	case !errors.Is(r.err, holdfast.ErrLost):
		s.t.Errorf("W: Lock after its session was killed: %v, want an error matching holdfast.ErrSessionLost (or holdfast.ErrLost)", r.err)
	}
	if ks, ok := s.waitKeys(settle, equals(onlyA)); !ok {
		s.t.Errorf("keys after W's session was killed: %q, want A's only: %q", ks, onlyA)
	}

	// The locker's session is gone: it must not hand out grants any more.
	ctx2, cancel2 := s.ctx(slack)
	r = s.await(start(ctx2, w, false), 2*slack, "W: Lock on a killed session")
	cancel2()
	if r.err == nil {
		s.t.Errorf("W: Lock on a Locker whose session was killed succeeded: %s", describe(r.g))
	}
	if ks, ok := s.waitKeys(settle, equals(onlyA)); !ok {
		s.t.Errorf("keys after W's Lock on a killed session: %q, want A's only: %q", ks, onlyA)
	}

	if isDone(ga.Context()) {
		s.t.Errorf("A's grant context done after W's session was killed: %v", context.Cause(ga.Context()))
	}
	s.unlock(ga, "A")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after A unlocked: %q", ks)
	}
}

// testBadInput: a nil context is bad input: Lock, TryLock and Unlock
// return an error wrapping holdfast.ErrInvalidArgument, write nothing, and
// change nothing (the grant stays held).
func testBadInput(s *suite) {
	a, o := s.locker(), s.locker()
	for _, try := range []bool{false, true} {
		//lint:ignore SA1012 a nil context is the bad input under test
		r := s.await(start(nil, a, try), slack, "A: Lock or TryLock with a nil context")
		switch {
		case r.err == nil:
			s.t.Errorf("A: try=%v with a nil context succeeded: %s", try, describe(r.g))
		case !errors.Is(r.err, holdfast.ErrInvalidArgument):
			s.t.Errorf("A: try=%v with a nil context: %v, want an error matching holdfast.ErrInvalidArgument", try, r.err)
		}
	}
	if ks := s.keys(); len(ks) != 0 {
		s.t.Errorf("keys after calls with a nil context: %q, want none", ks)
	}
	ga := s.lock(a, "A")
	//lint:ignore SA1012 a nil context is the bad input under test
	if err := s.unlockWith(nil, ga); !errors.Is(err, holdfast.ErrInvalidArgument) {
		s.t.Errorf("A: Unlock(nil): %v, want an error matching holdfast.ErrInvalidArgument", err)
	}
	if isDone(ga.Context()) {
		s.t.Errorf("A: grant context done after Unlock(nil): %v", context.Cause(ga.Context()))
	}
	s.expectLocked(o, "O after A's Unlock(nil)")
	s.unlock(ga, "A")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after A unlocked: %q", ks)
	}
}

// testNestedNames: names are paths, and a lock must not be used while a
// longer name under it is in use. Locking the shorter name then fails with
// holdfast.ErrConflict (not ErrLocked: waiting would never help), promptly,
// writing nothing; the longer name's holder is not affected. A longer name
// under a held shorter one can be locked.
func testNestedNames(s *suite) {
	sub, _ := s.lockerOn(s.name + "/sub")
	x, o := s.locker(), s.locker()
	gsub := s.lock(sub, "SUB on "+s.name+"/sub")
	before := s.keys()
	for _, try := range []bool{true, false} {
		ctx, cancel := s.ctx(s.op)
		r := s.await(start(ctx, x, try), s.op+slack, "X: lock of the shorter name")
		cancel()
		switch {
		case r.err == nil:
			s.t.Errorf("X: try=%v on %q while %q is held succeeded: %s", try, s.name, s.name+"/sub", describe(r.g))
			s.unlock(r.g, "X")
		case !errors.Is(r.err, holdfast.ErrConflict):
			s.t.Errorf("X: try=%v on %q while %q is held: %v, want an error matching holdfast.ErrConflict", try, s.name, s.name+"/sub", r.err)
		case r.took > slack:
			s.t.Errorf("X: try=%v took %v to report the conflict, want it at once", try, r.took)
		}
	}
	if ks, ok := s.waitKeys(settle, equals(before)); !ok {
		s.t.Errorf("keys after the conflicting locks: %q, want them unchanged: %q", ks, before)
	}
	if isDone(gsub.Context()) {
		s.t.Errorf("SUB: grant context done after the conflicting locks: %v", context.Cause(gsub.Context()))
	}
	s.unlock(gsub, "SUB")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Fatalf("keys left after SUB unlocked: %q", ks)
	}
	// The other way round: the longer name can be locked under a held one.
	gx := s.lock(x, "X on the shorter name, now free")
	s.expectLocked(o, "O while X holds")
	gsub = s.tryLock(sub, "SUB under a held X")
	s.unlock(gsub, "SUB")
	s.unlock(gx, "X")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after X and SUB unlocked: %q", ks)
	}
}

// testNoHerd: six waiters queue behind A, W1 first. A release wakes only the
// next waiter: while the lock passes from A to W1, at most one of the five
// waiters behind W1 (the new head of the queue, on stores where W1 leaves
// the queue) sends any request to the store. In a herd, every waiter
// re-reads the queue on every release.
func testNoHerd(s *suite) {
	const n = 6
	ga := s.lock(s.locker(), "A")
	prev := len(s.keys())
	ctx, cancel := s.ctx(2 * s.op)
	defer cancel()
	ws := make([]Faults, n)
	res := make([]<-chan result, n)
	for i := range n {
		var l holdfast.Locker
		l, ws[i] = s.lockerFaults()
		res[i] = start(ctx, l, false)
		ks, ok := s.waitKeys(keyWait, grows(prev))
		if !ok {
			s.t.Fatalf("W%d's queue key did not appear within %v: keys %q", i+1, keyWait, ks)
		}
		prev = len(ks)
	}
	time.Sleep(200 * time.Millisecond) // let every waiter settle into its wait
	var before [n]int64
	for i, f := range ws {
		before[i] = f.Requests()
	}
	s.unlock(ga, "A")
	r := s.await(res[0], s.op+slack, "W1: Lock after A's release")
	if r.err != nil {
		s.t.Fatalf("W1: Lock: %v", r.err)
	}
	time.Sleep(100 * time.Millisecond)
	var woken []int
	for i := 1; i < n; i++ {
		if ws[i].Requests() > before[i] {
			woken = append(woken, i+1)
		}
	}
	if len(woken) > 1 {
		s.t.Errorf("waiters %v sent requests while the lock passed from A to W1, want at most one of them: a release must wake only the next waiter", woken)
	}
	s.t.Logf("waiters behind W1 that sent requests during the handoff A -> W1: %v", woken)
	s.unlock(r.g, "W1")
	for i := 1; i < n; i++ {
		r := s.await(res[i], s.op+slack, "W: Lock")
		if r.err != nil {
			s.t.Fatalf("W%d: Lock: %v", i+1, r.err)
		}
		s.unlock(r.g, "W")
	}
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after every waiter unlocked: %q", ks)
	}
}

// expectLocked checks that TryLock through l fails with ErrLocked.
func (s *suite) expectLocked(l holdfast.Locker, who string) {
	s.t.Helper()
	ctx, cancel := s.ctx(2 * time.Second)
	defer cancel()
	r := s.await(start(ctx, l, true), 2*time.Second+slack, who+": TryLock")
	switch {
	case r.err == nil:
		s.t.Errorf("%s: TryLock succeeded: %s, want holdfast.ErrLocked", who, describe(r.g))
		s.unlock(r.g, who)
	case !errors.Is(r.err, holdfast.ErrLocked):
		s.t.Errorf("%s: TryLock: %v, want an error matching holdfast.ErrLocked", who, r.err)
	}
}
