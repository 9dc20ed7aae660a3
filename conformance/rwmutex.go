package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
)

// rw returns a new read-write lock of the subtest's name on a session of
// its own, and its faults.
func (s *suite) rw() (RWLocker, Faults) {
	s.t.Helper()
	l, f := s.b.NewRWMutex(s.t, s.name)
	if l == nil {
		s.t.Fatal("Backend.NewRWMutex returned a nil RWLocker")
	}
	s.faults(f, "NewRWMutex")
	return l, f
}

// rws returns n read-write locks of the subtest's name.
func (s *suite) rws(n int) []RWLocker {
	s.t.Helper()
	ls := make([]RWLocker, n)
	for i := range ls {
		ls[i], _ = s.rw()
	}
	return ls
}

// readLocker presents an RWLocker's read side as a Locker, so that the
// suite's helpers (start, tryLock, relock) drive it.
type readLocker struct{ l RWLocker }

func (r readLocker) Lock(ctx context.Context) (holdfast.Grant, error)    { return r.l.RLock(ctx) }
func (r readLocker) TryLock(ctx context.Context) (holdfast.Grant, error) { return r.l.TryRLock(ctx) }

// testRWExclusion: 3 writers and 4 readers, each on a session of its own,
// take the lock 4 times each and hold it 10 ms. Counted by a fenced counter
// (a grant counts while its context is live), a writer is never inside
// beside anyone; every write through a Fence with the write grant's token
// is admitted (write tokens increase in grant order); readers are inside
// together at some point.
func testRWExclusion(s *suite) {
	const writers, readers, k = 3, 4, 4
	ls := s.rws(writers + readers)
	ctx, cancel := s.ctx(2 * s.op)
	defer cancel()
	var (
		occ   = newOccupancy()
		fence holdfast.Fence
		errs  errList
		wg    sync.WaitGroup
	)
	for i, l := range ls {
		write := i < writers
		kind, lock := "read", readLocker{l}.Lock
		if write {
			kind, lock = "write", l.Lock
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range k {
				g, err := lock(ctx)
				if err != nil {
					errs.add("%s %d, cycle %d: lock: %v", kind, i, j, err)
					return
				}
				if g == nil {
					errs.add("%s %d, cycle %d: lock returned a nil Grant and a nil error", kind, i, j)
					return
				}
				live, who := occ.enter(g, kind)
				if live["write"] > 1 || (live["write"] == 1 && live["read"] > 0) {
					errs.add("%s %d, cycle %d: a writer beside another holder: %v", kind, i, j, who)
				}
				if write {
					if err := fence.Do(g.Token(), func() {}); err != nil {
						errs.add("writer %d, cycle %d: write under token %d refused by the fence: %v", i, j, g.Token(), err)
					}
				}
				time.Sleep(10 * time.Millisecond)
				occ.leave(g)
				uctx, ucancel := context.WithTimeout(ctx, s.op)
				err = g.Unlock(uctx)
				ucancel()
				if err != nil {
					errs.add("%s %d, cycle %d: Unlock: %v", kind, i, j, err)
					return
				}
			}
		}()
	}
	finished := waitGroup(&wg, 2*s.op+slack)
	errs.report(s.t)
	if !finished {
		s.t.Fatalf("clients did not finish within %v", 2*s.op+slack)
	}
	s.t.Logf("most readers inside at once: %d", occ.most("read"))
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every grant was released: %q", ks)
	}
}

// testRWReadersShare: 4 readers hold the lock at once (TryRLock succeeds
// for each); meanwhile TryLock (write) fails with ErrLocked and writes
// nothing. With a writer holding, TryRLock and TryLock fail with
// ErrLocked, and a reader's RLock waits until the writer's release.
func testRWReadersShare(s *suite) {
	const readers = 4
	ls := s.rws(readers + 1)
	w := ls[readers]
	rs := make([]holdfast.Grant, readers)
	for i := range rs {
		rs[i] = s.tryLock(readLocker{ls[i]}, fmt.Sprintf("R%d: TryRLock beside %d readers", i, i))
	}
	for i, g := range rs {
		if isDone(g.Context()) {
			s.t.Errorf("R%d: read grant context done while %d readers hold: %v", i, readers, context.Cause(g.Context()))
		}
	}
	before := s.keys()
	s.expectLocked(w, "W (write) while readers hold")
	if ks := s.keys(); !slices.Equal(ks, before) {
		s.t.Errorf("keys after a failed write TryLock: %q, want them unchanged: %q", ks, before)
	}
	for i, g := range rs {
		s.unlock(g, fmt.Sprintf("R%d", i))
	}

	gw := s.relock(w, "W (write) after the readers' release")
	s.expectLocked(readLocker{ls[0]}, "R0 (read) while W writes")
	s.expectLocked(ls[1], "R1 (write) while W writes")
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	rres := start(ctx, readLocker{ls[2]}, false)
	time.Sleep(300 * time.Millisecond)
	s.waiting(rres, "R2: RLock while W writes")
	s.unlock(gw, "W")
	r := s.await(rres, s.op+slack, "R2: RLock after W's release")
	if r.err != nil {
		s.t.Fatalf("R2: RLock after W's release: %v", r.err)
	}
	s.unlock(r.g, "R2")
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every grant was released: %q", ks)
	}
}

// testRWWriterNotStarved: while R1 reads, W queues for writing; R2, who
// asks for a read after W, waits behind W (and TryRLock fails with
// ErrLocked), although only readers hold the lock; after R1's release W
// writes, and after W's, R2 reads. A stream of readers cannot starve a
// writer.
func testRWWriterNotStarved(s *suite) {
	ls := s.rws(4)
	r1, w, r2, r3 := ls[0], ls[1], ls[2], ls[3]
	g1 := s.tryLock(readLocker{r1}, "R1: TryRLock")
	n := len(s.keys())
	ctx, cancel := s.ctx(2 * s.op)
	defer cancel()

	var (
		mu    sync.Mutex
		order []string
	)
	got := func(who string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, who)
	}
	wres := start(ctx, w, false)
	ks, ok := s.waitKeys(keyWait, grows(n))
	if !ok {
		s.t.Fatalf("W's key did not appear within %v: keys %q", keyWait, ks)
	}
	r2res := start(ctx, readLocker{r2}, false)
	if ks, ok := s.waitKeys(keyWait, grows(len(ks))); !ok {
		s.t.Fatalf("R2's key did not appear within %v: keys %q", keyWait, ks)
	}
	time.Sleep(200 * time.Millisecond)
	s.waiting(r2res, "R2: RLock behind a queued writer (a writer must not be starved by readers)")
	s.waiting(wres, "W: Lock while R1 reads")
	s.expectLocked(readLocker{r3}, "R3 (read) while W is queued")

	s.unlock(g1, "R1")
	rw := s.await(wres, s.op+slack, "W: Lock after R1's release")
	if rw.err != nil {
		s.t.Fatalf("W: Lock after R1's release: %v", rw.err)
	}
	got("W")
	time.Sleep(100 * time.Millisecond)
	s.waiting(r2res, "R2: RLock while W writes")
	s.unlock(rw.g, "W")
	r := s.await(r2res, s.op+slack, "R2: RLock after W's release")
	if r.err != nil {
		s.t.Fatalf("R2: RLock after W's release: %v", r.err)
	}
	got("R2")
	s.unlock(r.g, "R2")
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(order, []string{"W", "R2"}) {
		s.t.Errorf("grant order %v, want [W R2]", order)
	}
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every grant was released: %q", ks)
	}
}

// testRWCancelCleanup: a reader waiting behind a writer and a writer
// waiting behind a reader, their contexts cancelled (or past their
// deadline), return the context's error and leave nothing behind; the
// holder keeps its grant.
func testRWCancelCleanup(s *suite) {
	ls := s.rws(3)
	for _, c := range []struct {
		holder, waiter string
		holdWrite      bool
	}{{"W (write)", "R (read)", true}, {"R (read)", "W (write)", false}} {
		var hold, wait holdfast.Locker = readLocker{ls[0]}, ls[1]
		if c.holdWrite {
			hold, wait = ls[0], readLocker{ls[1]}
		}
		g := s.relock(hold, c.holder)
		only := s.keys()

		bctx, bcancel := context.WithCancel(s.root)
		res := start(bctx, wait, false)
		if ks, ok := s.waitKeys(keyWait, grows(len(only))); !ok {
			bcancel()
			s.t.Fatalf("%s's key did not appear within %v: keys %q", c.waiter, keyWait, ks)
		}
		time.Sleep(100 * time.Millisecond)
		s.waiting(res, c.waiter+" while "+c.holder+" holds")
		bcancel()
		r := s.await(res, slack, c.waiter+" after its context was cancelled")
		if r.err == nil || !errors.Is(r.err, context.Canceled) {
			s.t.Errorf("%s, cancelled while %s holds: grant %s, err %v, want an error matching context.Canceled", c.waiter, c.holder, describe(r.g), r.err)
		}
		if ks, ok := s.waitKeys(settle, equals(only)); !ok {
			s.t.Fatalf("keys %v after %s's cancelled wait: %q, want the holder's only: %q (left behind: %q)", settle, c.waiter, ks, only, without(ks, only))
		}

		// X asks for the other kind than the holder's, with a deadline.
		var x holdfast.Locker = ls[2]
		if c.holdWrite {
			x = readLocker{ls[2]}
		}
		dctx, dcancel := context.WithTimeout(s.root, 300*time.Millisecond)
		r = s.await(start(dctx, x, false), 300*time.Millisecond+slack, "X: lock with a 300 ms deadline")
		dcancel()
		if r.err == nil || !errors.Is(r.err, context.DeadlineExceeded) {
			s.t.Errorf("X: lock past its deadline while %s holds: grant %s, err %v, want an error matching context.DeadlineExceeded", c.holder, describe(r.g), r.err)
		}
		if ks, ok := s.waitKeys(settle, equals(only)); !ok {
			s.t.Fatalf("keys %v after X gave up: %q, want the holder's only: %q (left behind: %q)", settle, ks, only, without(ks, only))
		}
		if isDone(g.Context()) {
			s.t.Errorf("%s: grant context done after the waiters gave up: %v", c.holder, context.Cause(g.Context()))
		}
		s.unlock(g, c.holder)
		if ks, ok := s.waitKeys(settle, idle); !ok {
			s.t.Errorf("keys left after %s's release: %q", c.holder, ks)
		}
	}
}

// testRWTokens: write grants taken in turn by 3 clients, with read grants
// in between, have non-zero tokens that strictly increase; every grant's
// key is under the name, and its context ends with ErrReleased on Unlock.
func testRWTokens(s *suite) {
	ls := s.rws(3)
	var prev holdfast.Token
	for i := range 9 {
		l := ls[i%len(ls)]
		who := fmt.Sprintf("write %d", i)
		g := s.relock(l, who)
		switch tok := g.Token(); {
		case tok == 0:
			s.t.Errorf("%s: token 0", who)
		case tok <= prev:
			s.t.Errorf("%s: token %d after %d, want write tokens to strictly increase", who, tok, prev)
		}
		prev = g.Token()
		if !s.under(g.Key()) {
			s.t.Errorf("%s: Key() = %q, want a key under %q", who, g.Key(), s.name+"/")
		}
		s.unlock(g, who)
		if !errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) {
			s.t.Errorf("%s: context cause after Unlock: %v, want holdfast.ErrReleased", who, context.Cause(g.Context()))
		}
		if i%3 == 1 {
			r := s.relock(readLocker{ls[(i+1)%len(ls)]}, "read after "+who)
			if r.Token() == 0 || !s.under(r.Key()) {
				s.t.Errorf("read after %s: grant %s, want a non-zero token and a key under %q", who, describe(r), s.name+"/")
			}
			s.unlock(r, "read after "+who)
		}
	}
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every grant was released: %q", ks)
	}
}

// testRWPromptAdmission: PromptAdmission for readers: 3 readers that call
// RLock at the same moment are all granted promptly, and so are 2 beside a
// reader already in, each 8 times.
func testRWPromptAdmission(s *suite) {
	ls := s.rws(4)
	readers := make([]holdfast.Locker, 3)
	for i := range readers {
		readers[i] = readLocker{ls[i]}
	}
	s.promptAdmission(readLocker{ls[3]}, readers, "read grant")
}

// testRWDowngrade: Downgrade means the same on every store. W writes, R
// waits to read, X waits to write behind R. Downgrade(W) returns a read
// grant with W's key and token; W ends (ErrReleased; its Unlock fails with
// ErrNotHeld); R is let in, X is not until both readers release. A
// Downgrade with a done context fails and still ends the write grant, and
// the lock is freed; a Downgrade of a grant that is not held fails with
// ErrNotHeld.
func testRWDowngrade(s *suite) {
	ls := s.rws(3)
	w, r, x := ls[0], readLocker{ls[1]}, ls[2]
	gw := s.lock(w, "W (write)")
	only := s.keys()
	ctx, cancel := s.ctx(2 * s.op)
	defer cancel()
	rres := start(ctx, r, false)
	ks, ok := s.waitKeys(keyWait, grows(len(only)))
	if !ok {
		s.t.Fatalf("R's key did not appear within %v: keys %q", keyWait, ks)
	}
	xres := start(ctx, x, false)
	if ks, ok := s.waitKeys(keyWait, grows(len(ks))); !ok {
		s.t.Fatalf("X's key did not appear within %v: keys %q", keyWait, ks)
	}
	s.waiting(rres, "R: RLock while W writes")

	dctx, dcancel := s.ctx(s.op)
	gd, err := w.Downgrade(dctx, gw)
	dcancel()
	if err != nil {
		s.t.Fatalf("W: Downgrade: %v", err)
	}
	s.track(gd)
	if gd.Key() != gw.Key() || gd.Token() != gw.Token() {
		s.t.Errorf("W: Downgrade returned %s, want W's key and token: %s", describe(gd), describe(gw))
	}
	if !errors.Is(context.Cause(gw.Context()), holdfast.ErrReleased) {
		s.t.Errorf("W: write grant's cause after Downgrade: %v, want holdfast.ErrReleased", context.Cause(gw.Context()))
	}
	if isDone(gd.Context()) {
		s.t.Errorf("W: read grant context done after Downgrade: %v", context.Cause(gd.Context()))
	}
	if err := s.unlockErr(gw); !errors.Is(err, holdfast.ErrNotHeld) {
		s.t.Errorf("W: Unlock of the downgraded write grant: %v, want an error matching holdfast.ErrNotHeld", err)
	}
	rr := s.await(rres, s.op+slack, "R: RLock after W's Downgrade")
	if rr.err != nil {
		s.t.Fatalf("R: RLock after W's Downgrade: %v, want the read grant beside W's", rr.err)
	}
	time.Sleep(100 * time.Millisecond)
	s.waiting(xres, "X: Lock while W (downgraded) and R read")
	s.unlock(gd, "W (read)")
	s.unlock(rr.g, "R")
	xr := s.await(xres, s.op+slack, "X: Lock after the readers' release")
	if xr.err != nil {
		s.t.Fatalf("X: Lock after the readers' release: %v", xr.err)
	}

	// A Downgrade that fails ends the write grant all the same.
	cctx, ccancel := context.WithCancel(s.root)
	ccancel()
	if g, err := x.Downgrade(cctx, xr.g); err == nil {
		s.t.Errorf("X: Downgrade with a cancelled context succeeded: %s", describe(g))
		s.unlock(g, "X (read)")
	}
	if !waitDone(xr.g.Context(), promptly) {
		s.t.Errorf("X: write grant context not done after a failed Downgrade: want it ended whatever the outcome")
	}
	if _, err := x.Downgrade(s.root, xr.g); !errors.Is(err, holdfast.ErrNotHeld) {
		s.t.Errorf("X: Downgrade of an ended write grant: %v, want an error matching holdfast.ErrNotHeld", err)
	}
	gw = s.relock(w, "W after X's failed Downgrade")
	s.unlock(gw, "W")
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every grant was released: %q", ks)
	}
}

// testRWReentrancy: a read-write lock is not reentrant, on every store. Its
// constructor refuses holdfast.WithReentrant with an error wrapping
// holdfast.ErrInvalidArgument, leaving no key. Through a lock made without
// it, a second Lock or RLock while it holds the write lock, and a Lock
// while it holds a read lock, wait like any other contender's and leave no
// key when they give up.
func testRWReentrancy(s *suite) {
	if l, err := s.b.TryNewRWMutex(s.t, s.name, holdfast.WithReentrant()); !errors.Is(err, holdfast.ErrInvalidArgument) {
		s.t.Errorf("read-write lock made with WithReentrant: (%v, %v), want an error matching holdfast.ErrInvalidArgument", l, err)
	}
	l, err := s.b.TryNewRWMutex(s.t, s.name)
	if err != nil || l == nil {
		s.t.Fatalf("read-write lock made without options: (%v, %v), want a lock", l, err)
	}
	if ks := s.keys(); len(ks) > 0 {
		s.t.Errorf("keys after the constructors: %q, want none", ks)
	}
	blocks := func(second holdfast.Locker, holds holdfast.Grant, what string) {
		before := s.keys()
		ctx, cancel := context.WithTimeout(s.root, 300*time.Millisecond)
		res := s.await(start(ctx, second, false), 300*time.Millisecond+slack, what)
		cancel()
		switch {
		case res.err == nil:
			s.t.Errorf("%s returned %s, want it to block", what, describe(res.g))
		case !errors.Is(res.err, context.DeadlineExceeded):
			s.t.Errorf("%s: %v, want it to block until its deadline (context.DeadlineExceeded)", what, res.err)
		}
		if ks := s.keys(); !slices.Equal(ks, before) {
			s.t.Errorf("keys after %s gave up: %q, want them unchanged: %q", what, ks, before)
		}
		if isDone(holds.Context()) {
			s.t.Errorf("grant context done after %s gave up: %v", what, context.Cause(holds.Context()))
		}
	}
	w := s.lock(l, "L, write lock")
	blocks(l, w, "L: second Lock while it writes")
	blocks(readLocker{l}, w, "L: RLock while it writes")
	s.unlock(w, "L, write lock")
	r := s.lock(readLocker{l}, "L, read lock")
	blocks(l, r, "L: Lock while it reads")
	s.unlock(r, "L, read lock")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after every grant was released: %q", ks)
	}
}
