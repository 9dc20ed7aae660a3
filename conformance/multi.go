package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
)

// MultiGrant is a held multi-name lock as the suite sees it.
type MultiGrant interface {
	// Names returns the names held, sorted.
	Names() []string
	// Key and Token return the key and fencing token of name's part.
	Key(name string) string
	Token(name string) holdfast.Token
	// Context ends when any part ends.
	Context() context.Context
	// Unlock releases every part.
	Unlock(ctx context.Context) error
}

// MultiLocker locks a set of names as one grant.
type MultiLocker interface {
	Lock(ctx context.Context) (MultiGrant, error)
}

// MultiLockerOf is what both backends' MultiMutex offer; AsMultiLocker
// turns one into a MultiLocker.
type MultiLockerOf[G MultiGrant] interface {
	Lock(ctx context.Context) (G, error)
}

// AsMultiLocker returns l as a MultiLocker.
func AsMultiLocker[G MultiGrant](l MultiLockerOf[G]) MultiLocker { return multiLocker[G]{l} }

type multiLocker[G MultiGrant] struct{ l MultiLockerOf[G] }

func (m multiLocker[G]) Lock(ctx context.Context) (MultiGrant, error) {
	g, err := m.l.Lock(ctx)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// multiClient returns a function that makes multi-name locks on one new
// session, and the session's faults.
func (s *suite) multiClient() (func(names ...string) MultiLocker, Faults) {
	s.t.Helper()
	newLocker, f := s.b.NewMultiLocker(s.t)
	s.faults(f, "NewMultiLocker")
	return func(names ...string) MultiLocker {
		s.t.Helper()
		l, err := newLocker(names...)
		if err != nil {
			s.t.Fatalf("multi-name lock of %v: %v", names, err)
		}
		return l
	}, f
}

// multiNames returns n names under the subtest's name.
func (s *suite) multiNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s/n%d", s.name, i)
	}
	return names
}

// testMultiNoDeadlock: 8 clients lock random subsets (2 to 4) of 6 names,
// passing them in random order, and hold each set 0 to 3 ms, for
// Backend.MultiRun (default 5 s). Every Lock completes (a deadlock would
// show as Locks that end only at their own deadline, OpTimeout); no name
// has two live holders at once; tokens of each name strictly increase in
// the order its holders enter (a fence would accept every write); every
// client gets the lock; nothing is left after the last Unlock.
func testMultiNoDeadlock(s *suite) {
	const clients, nNames = 8, 6
	names := s.multiNames(nNames)
	run := s.b.MultiRun
	if run == 0 {
		run = 5 * time.Second
	}
	ctx, cancel := s.ctx(run + 2*s.op)
	defer cancel()
	var (
		mu     sync.Mutex
		holder = map[string]int{}            // name -> client holding it, while held
		last   = map[string]holdfast.Token{} // name -> last token that entered
		count  = make([]int, clients)
		errs   errList
		wg     sync.WaitGroup
	)
	end := time.Now().Add(run)
	for c := range clients {
		newLocker, _ := s.multiClient()
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				set := slices.Clone(names)
				rand.Shuffle(len(set), func(i, j int) { set[i], set[j] = set[j], set[i] })
				set = set[:2+rand.IntN(3)]
				l := newLocker(set...)
				lctx, lcancel := context.WithTimeout(ctx, s.op)
				start := time.Now()
				g, err := l.Lock(lctx)
				lcancel()
				if err != nil {
					errs.add("client %d: Lock %v after %v: %v (a deadlock?)", c, set, time.Since(start).Round(time.Millisecond), err)
					return
				}
				mu.Lock()
				for _, n := range set {
					if h, ok := holder[n]; ok {
						errs.add("client %d: holds %s while client %d holds it", c, n, h)
					}
					holder[n] = c
					tok := g.Token(n)
					if tok <= last[n] {
						errs.add("client %d: token %d of %s, not above the last holder's %d", c, tok, n, last[n])
					}
					last[n] = tok
				}
				count[c]++
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(4)) * time.Millisecond)
				if err := g.Context().Err(); err != nil {
					errs.add("client %d: context of %v done while held: %v", c, set, context.Cause(g.Context()))
				}
				mu.Lock()
				for _, n := range set {
					delete(holder, n)
				}
				mu.Unlock()
				uctx, ucancel := context.WithTimeout(ctx, s.op)
				err = g.Unlock(uctx)
				ucancel()
				if err != nil {
					errs.add("client %d: Unlock %v: %v", c, set, err)
					return
				}
				if !errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) {
					errs.add("client %d: context cause after Unlock: %v, want ErrReleased", c, context.Cause(g.Context()))
				}
			}
		})
	}
	finished := waitGroup(&wg, run+2*s.op+slack)
	errs.report(s.t)
	if !finished {
		s.t.Fatalf("clients did not finish within %v: deadlock", run+2*s.op+slack)
	}
	total := 0
	for c, n := range count {
		total += n
		if n == 0 {
			s.t.Errorf("client %d never got its lock", c)
		}
	}
	s.t.Logf("%d acquisitions of 2-4 of %d names by %d clients in %v: %v", total, nNames, clients, run, count)
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every multi-name lock was released: %q", ks)
	}
}

// testMultiCancel: while another client holds n1, a Lock of {n1, n0}
// (passed in that order) takes n0, waits for n1 and gives up with its
// context: it returns the context's error, and leaves nothing held or
// queued (only the other holder's key remains). A later Lock of the same
// set succeeds once n1 is free.
func testMultiCancel(s *suite) {
	names := s.multiNames(2)
	newA, _ := s.multiClient()
	newB, _ := s.multiClient()
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	a, err := newA(names[1]).Lock(ctx)
	if err != nil {
		s.t.Fatalf("A: Lock %s: %v", names[1], err)
	}
	aKey := a.Key(names[1])
	wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	g, err := newB(names[1], names[0]).Lock(wctx)
	wcancel()
	if err == nil {
		_ = g.Unlock(ctx)
		s.t.Fatalf("B: Lock %v while A holds %s succeeded", names, names[1])
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		s.t.Errorf("B: Lock with an expiring context: %v, want context.DeadlineExceeded", err)
	}
	if ks, ok := s.waitKeys(settle, func(ks []string) bool { return slices.Equal(ks, []string{aKey}) }); !ok {
		s.t.Errorf("keys after B gave up: %q, want only A's %q (nothing of B held or queued)", ks, aKey)
	}
	if err := a.Unlock(ctx); err != nil {
		s.t.Fatalf("A: Unlock: %v", err)
	}
	g, err = newB(names...).Lock(ctx)
	if err != nil {
		s.t.Fatalf("B: Lock %v once free: %v", names, err)
	}
	if err := g.Unlock(ctx); err != nil {
		s.t.Errorf("B: Unlock: %v", err)
	}
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after the last Unlock: %q", ks)
	}
}

// testMultiLoss: deleting one part's key (as an operator would) ends the
// multi-grant's context within LossNotice, with a cause wrapping ErrLost
// that names the part; Unlock then releases the other parts and nothing is
// left.
func testMultiLoss(s *suite) {
	names := s.multiNames(3)
	newLocker, _ := s.multiClient()
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	g, err := newLocker(names[2], names[0], names[1]).Lock(ctx)
	if err != nil {
		s.t.Fatalf("Lock %v: %v", names, err)
	}
	if got := g.Names(); !slices.Equal(got, names) {
		s.t.Errorf("Names() = %v, want %v (sorted)", got, names)
	}
	for _, n := range names {
		if g.Token(n) == 0 || !strings.HasPrefix(g.Key(n), n+"/") {
			s.t.Errorf("part %s: key %q token %d: want a key under %s/ and a non-zero token", n, g.Key(n), g.Token(n), n)
		}
	}
	time.Sleep(200 * time.Millisecond) // past the backends' delay before they watch a held key
	s.b.Delete(s.t, g.Key(names[1]))
	select {
	case <-g.Context().Done():
	case <-time.After(s.b.LossNotice + slack):
		s.t.Fatalf("context still live %v after a part's key was deleted", s.b.LossNotice+slack)
	}
	cause := context.Cause(g.Context())
	if !errors.Is(cause, holdfast.ErrLost) || !strings.Contains(cause.Error(), names[1]) {
		s.t.Errorf("cause %v: want one wrapping holdfast.ErrLost that names %s", cause, names[1])
	}
	_ = g.Unlock(ctx) // the lost part answers ErrNotHeld
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after Unlock of a multi-grant with a lost part: %q", ks)
	}
}

// testMultiFIFO: A holds n0; W1, W2, W3 each lock {n1, n0} (passed in that
// order) one after the other, each queued behind the previous one on n0
// (its key appears before the next starts). When A releases, they get the
// multi-name lock in arrival order: FIFO per name is kept.
func testMultiFIFO(s *suite) {
	const n = 3
	names := s.multiNames(2)
	newA, _ := s.multiClient()
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	a, err := newA(names[0]).Lock(ctx)
	if err != nil {
		s.t.Fatalf("A: Lock %s: %v", names[0], err)
	}
	prev := len(s.keys())
	var (
		mu    sync.Mutex
		order []int
		errs  errList
		wg    sync.WaitGroup
	)
	granted := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(order)
	}
	for i := 1; i <= n; i++ {
		newW, _ := s.multiClient()
		l := newW(names[1], names[0])
		wg.Go(func() {
			g, err := l.Lock(ctx)
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
		})
		ks, ok := s.waitKeys(keyWait, func(ks []string) bool { return len(ks) > prev || granted() > 0 })
		if granted() > 0 {
			errs.report(s.t)
			s.t.Fatalf("a waiter got the lock while A held %s", names[0])
		}
		if !ok {
			errs.report(s.t)
			s.t.Fatalf("W%d's queue key did not appear within %v: keys %q", i, keyWait, ks)
		}
		prev = len(ks)
	}
	if err := a.Unlock(ctx); err != nil {
		s.t.Fatalf("A: Unlock: %v", err)
	}
	finished := waitGroup(&wg, s.op+slack)
	errs.report(s.t)
	if !finished {
		s.t.Fatalf("waiters did not all get the lock within %v after A's release", s.op+slack)
	}
	if want := []int{1, 2, 3}; !slices.Equal(order, want) {
		s.t.Errorf("grant order %v, want %v (first come, first served on %s)", order, want, names[0])
	}
	if ks, ok := s.waitKeys(settle, idle); !ok {
		s.t.Errorf("keys left after every waiter unlocked: %q", ks)
	}
}
