package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/leader"
)

// candidate returns a new candidate in the subtest's election on a session
// of its own, and its faults.
func (s *suite) candidate() (leader.Candidate[holdfast.Grant], Faults) {
	s.t.Helper()
	c, f := s.b.NewElection(s.t, s.name)
	if c == nil {
		s.t.Fatal("Backend.NewElection returned a nil Candidate")
	}
	s.faults(f, "NewElection")
	return c, f
}

// campaigner presents a candidate as a Locker that campaigns with value,
// so that the suite's helpers (start, lock) drive it. TryLock is not used.
type campaigner struct {
	c     leader.Candidate[holdfast.Grant]
	value []byte
}

func (c campaigner) Lock(ctx context.Context) (holdfast.Grant, error) {
	return c.c.Campaign(ctx, c.value)
}

func (c campaigner) TryLock(ctx context.Context) (holdfast.Grant, error) {
	return nil, errors.New("conformance: TryLock of a candidate")
}

// campaign starts c's campaign with value.
func campaign(ctx context.Context, c leader.Candidate[holdfast.Grant], value string) <-chan result {
	return start(ctx, campaigner{c, []byte(value)}, false)
}

// win campaigns with value and fails the subtest now if c does not win
// within the operation timeout.
func (s *suite) win(c leader.Candidate[holdfast.Grant], value string) holdfast.Grant {
	s.t.Helper()
	return s.lock(campaigner{c, []byte(value)}, value+": Campaign")
}

// leaderNow calls c.Leader, bounded.
func (s *suite) leaderNow(c leader.Candidate[holdfast.Grant]) (holdfast.Leader, error) {
	s.t.Helper()
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	type res struct {
		l   holdfast.Leader
		err error
	}
	ch := make(chan res, 1)
	go func() {
		l, err := c.Leader(ctx)
		ch <- res{l, err}
	}()
	select {
	case r := <-ch:
		return r.l, r.err
	case <-time.After(s.op + slack):
		s.t.Fatalf("Leader did not return within %v", s.op+slack)
		return holdfast.Leader{}, nil
	}
}

// expectLeader waits up to settle for c.Leader to report g's leadership
// with value.
func (s *suite) expectLeader(c leader.Candidate[holdfast.Grant], g holdfast.Grant, value, who string) {
	s.t.Helper()
	deadline := time.Now().Add(settle)
	for {
		l, err := s.leaderNow(c)
		if err == nil && l.Key == g.Key() && l.Term == g.Token() && string(l.Value) == value {
			return
		}
		if time.Now().After(deadline) {
			s.t.Errorf("Leader while %s leads: %s, err %v; want key %q, term %d, value %q", who, describeLeader(l), err, g.Key(), g.Token(), value)
			return
		}
		time.Sleep(poll)
	}
}

// expectNoLeader waits up to settle for c.Leader to fail with ErrNoLeader.
func (s *suite) expectNoLeader(c leader.Candidate[holdfast.Grant], when string) {
	s.t.Helper()
	deadline := time.Now().Add(settle)
	for {
		l, err := s.leaderNow(c)
		if errors.Is(err, holdfast.ErrNoLeader) {
			return
		}
		if time.Now().After(deadline) {
			s.t.Errorf("Leader %s: %s, err %v; want an error matching holdfast.ErrNoLeader", when, describeLeader(l), err)
			return
		}
		time.Sleep(poll)
	}
}

func describeLeader(l holdfast.Leader) string {
	if l.None() {
		return "{no leader}"
	}
	return fmt.Sprintf("{key %q, term %d, value %q}", l.Key, l.Term, l.Value)
}

// testElectionOneLeader: 4 candidates on sessions of their own campaign 3
// times each, lead for 10 ms and resign. Counted by a fenced counter (a
// leadership counts while its context is live), there is never more than
// one leader; terms strictly increase in the order of winning, and every
// write through a Fence with the term is admitted; Leader, asked by the
// leader, reports its own key, term and value.
func testElectionOneLeader(s *suite) {
	const n, k = 4, 3
	cs := make([]leader.Candidate[holdfast.Grant], n)
	for i := range cs {
		cs[i], _ = s.candidate()
	}
	ctx, cancel := s.ctx(2 * s.op)
	defer cancel()
	var (
		occ   = newOccupancy()
		fence holdfast.Fence
		mu    sync.Mutex
		terms []holdfast.Token
		errs  errList
		wg    sync.WaitGroup
	)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range k {
				value := fmt.Sprintf("c%d-%d", i, j)
				g, err := c.Campaign(ctx, []byte(value))
				if err != nil {
					errs.add("candidate %d, term %d: Campaign: %v", i, j, err)
					return
				}
				if g == nil {
					errs.add("candidate %d, term %d: Campaign returned a nil Grant and a nil error", i, j)
					return
				}
				if live, who := occ.enter(g, ""); live[""] > 1 {
					errs.add("candidate %d, term %d: %d leaders at once: %v", i, j, live[""], who)
				}
				mu.Lock()
				if last := len(terms) - 1; last >= 0 && g.Token() <= terms[last] {
					errs.add("candidate %d won with term %d after term %d: terms must strictly increase", i, g.Token(), terms[last])
				}
				terms = append(terms, g.Token())
				mu.Unlock()
				if err := fence.Do(g.Token(), func() {}); err != nil {
					errs.add("candidate %d: write under term %d refused by the fence: %v", i, g.Token(), err)
				}
				lctx, lcancel := context.WithTimeout(ctx, s.op)
				l, err := c.Leader(lctx)
				lcancel()
				if err != nil || l.Key != g.Key() || l.Term != g.Token() || string(l.Value) != value {
					errs.add("candidate %d, leading with term %d: Leader: %s, err %v; want its own key %q, term and value %q", i, g.Token(), describeLeader(l), err, g.Key(), value)
				}
				time.Sleep(10 * time.Millisecond)
				if err := g.Context().Err(); err != nil {
					errs.add("candidate %d: leadership context done while leading: %v", i, context.Cause(g.Context()))
				}
				occ.leave(g)
				uctx, ucancel := context.WithTimeout(ctx, s.op)
				err = g.Unlock(uctx)
				ucancel()
				if err != nil {
					errs.add("candidate %d, term %d: resign (Unlock): %v", i, g.Token(), err)
					return
				}
			}
		}()
	}
	finished := waitGroup(&wg, 2*s.op+slack)
	errs.report(s.t)
	if !finished {
		s.t.Fatalf("candidates did not finish within %v", 2*s.op+slack)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(terms) != n*k {
		s.t.Errorf("%d terms, want %d", len(terms), n*k)
	}
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after every leader resigned: %q", ks)
	}
}

// testElectionObserve: an observer's Observe delivers "no leader" first;
// then, while it does not read, A leads, B and C (queued in that order)
// follow as each resigns, and nobody leads at the end. Reading then, it
// gets leaders in order of terms, never a term lower than one it has seen,
// each with its key and value, and ends with "no leader"; with ObserveAll
// it gets every one of A, B and C. The channel is closed once the
// observer's context ends.
func testElectionObserve(s *suite) {
	o, _ := s.candidate()
	a, _ := s.candidate()
	b, _ := s.candidate()
	c, _ := s.candidate()
	octx, ocancel := context.WithCancel(s.root)
	defer ocancel()
	ch := o.Observe(octx)
	select {
	case l, ok := <-ch:
		if !ok || !l.None() {
			s.t.Fatalf("Observe's first state with nobody campaigning: %s (open %v), want no leader", describeLeader(l), ok)
		}
	case <-time.After(s.op):
		s.t.Fatalf("Observe delivered nothing within %v", s.op)
	}

	ga := s.win(a, "A")
	n := len(s.keys())
	ctx, cancel := s.ctx(2 * s.op)
	defer cancel()
	bres := campaign(ctx, b, "B")
	if ks, ok := s.waitKeys(keyWait, grows(n)); !ok {
		s.t.Fatalf("B's key did not appear within %v: keys %q", keyWait, ks)
	}
	cres := campaign(ctx, c, "C")
	if ks, ok := s.waitKeys(keyWait, grows(n+1)); !ok {
		s.t.Fatalf("C's key did not appear within %v: keys %q", keyWait, ks)
	}
	s.unlock(ga, "A")
	rb := s.await(bres, s.op+slack, "B: Campaign after A resigned")
	if rb.err != nil {
		s.t.Fatalf("B: Campaign after A resigned: %v", rb.err)
	}
	s.unlock(rb.g, "B")
	rc := s.await(cres, s.op+slack, "C: Campaign after B resigned")
	if rc.err != nil {
		s.t.Fatalf("C: Campaign after B resigned: %v", rc.err)
	}
	s.unlock(rc.g, "C")
	want := []holdfast.Leader{
		{Key: ga.Key(), Value: []byte("A"), Term: ga.Token()},
		{Key: rb.g.Key(), Value: []byte("B"), Term: rb.g.Token()},
		{Key: rc.g.Key(), Value: []byte("C"), Term: rc.g.Token()},
	}

	// Drain until the latest state is "no leader" and nothing more comes
	// for a while.
	var seen []holdfast.Leader
	timeout := time.After(s.op)
	quiet := 300 * time.Millisecond
drain:
	for {
		select {
		case l, ok := <-ch:
			if !ok {
				s.t.Fatalf("Observe's channel closed while its context lives; seen %v", describeLeaders(seen))
			}
			seen = append(seen, l)
		case <-time.After(quiet):
			if len(seen) > 0 && seen[len(seen)-1].None() {
				break drain
			}
		case <-timeout:
			s.t.Fatalf("Observe did not deliver the end (no leader) within %v; seen %v", s.op, describeLeaders(seen))
		}
	}
	s.t.Logf("observed %v", describeLeaders(seen))
	var got []holdfast.Leader
	var top holdfast.Token
	for _, l := range seen {
		if l.None() {
			continue
		}
		if l.Term < top {
			s.t.Errorf("Observe delivered term %d after term %d: out of order: %v", l.Term, top, describeLeaders(seen))
		}
		top = max(top, l.Term)
		if len(got) > 0 && got[len(got)-1].Term == l.Term {
			continue // the same leader again
		}
		got = append(got, l)
	}
	var j int
	for _, l := range got {
		for j < len(want) && want[j].Term != l.Term {
			j++
		}
		if j == len(want) {
			s.t.Errorf("Observe delivered %s, not one of the leaders %v (or out of order)", describeLeader(l), describeLeaders(want))
			break
		}
		if l.Key != want[j].Key || !bytes.Equal(l.Value, want[j].Value) {
			s.t.Errorf("Observe delivered %s for term %d, want %s", describeLeader(l), l.Term, describeLeader(want[j]))
		}
	}
	if s.b.ObserveAll && len(got) != len(want) {
		s.t.Errorf("Observe delivered leaders %v, want every one of %v (Backend.ObserveAll)", describeLeaders(got), describeLeaders(want))
	}

	ocancel()
	closed := time.After(slack)
	for {
		select {
		case _, ok := <-ch:
			if ok {
				continue
			}
		case <-closed:
			s.t.Errorf("Observe's channel not closed %v after its context ended", slack)
		}
		break
	}
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after every leader resigned: %q", ks)
	}
}

func describeLeaders(ls []holdfast.Leader) []string {
	d := make([]string, len(ls))
	for i, l := range ls {
		d[i] = describeLeader(l)
	}
	return d
}

// testElectionLeader: Leader fails with ErrNoLeader while nobody leads;
// reports the leader's key, term and value to another candidate; is not
// changed by a candidate waiting; follows a resignation to the next
// leader; and fails with ErrNoLeader again once the last one resigns. A
// Campaign whose context is cancelled while another leads returns the
// context's error and leaves nothing behind.
func testElectionLeader(s *suite) {
	o, _ := s.candidate()
	a, _ := s.candidate()
	b, _ := s.candidate()
	c, _ := s.candidate()
	s.expectNoLeader(o, "with nobody campaigning")

	ga := s.win(a, "A")
	s.expectLeader(o, ga, "A", "A")
	only := s.keys()

	// A campaign cancelled while A leads.
	cctx, ccancel := context.WithCancel(s.root)
	t0 := time.Now()
	cres := campaign(cctx, c, "C")
	if ks, ok := s.waitKeys(keyWait, grows(len(only))); !ok {
		ccancel()
		s.t.Fatalf("C's key did not appear within %v: keys %q", keyWait, ks)
	}
	time.Sleep(200*time.Millisecond - time.Since(t0))
	s.waiting(cres, "C: Campaign while A leads")
	ccancel()
	r := s.await(cres, slack, "C: Campaign after its context was cancelled")
	if r.err == nil || !errors.Is(r.err, context.Canceled) {
		s.t.Errorf("C: Campaign while A leads, cancelled: grant %s, err %v, want an error matching context.Canceled", describe(r.g), r.err)
	}
	if ks, ok := s.waitKeys(settle, equals(only)); !ok {
		s.t.Fatalf("keys %v after C's cancelled Campaign: %q, want A's only: %q (left behind: %q)", settle, ks, only, without(ks, only))
	}
	dctx, dcancel := context.WithCancel(s.root)
	dcancel()
	r = s.await(campaign(dctx, c, "D"), slack, "D: Campaign with an already-cancelled context")
	if r.err == nil || !errors.Is(r.err, context.Canceled) {
		s.t.Errorf("D: Campaign with an already-cancelled context: grant %s, err %v, want an error matching context.Canceled", describe(r.g), r.err)
	}

	ctx, cancel := s.ctx(s.op)
	defer cancel()
	bres := campaign(ctx, b, "B")
	if ks, ok := s.waitKeys(keyWait, grows(len(only))); !ok {
		s.t.Fatalf("B's key did not appear within %v: keys %q", keyWait, ks)
	}
	s.expectLeader(o, ga, "A", "A, with B waiting")
	if isDone(ga.Context()) {
		s.t.Errorf("A: leadership context done after other candidates came and went: %v", context.Cause(ga.Context()))
	}
	s.unlock(ga, "A")
	rb := s.await(bres, s.op+slack, "B: Campaign after A resigned")
	if rb.err != nil {
		s.t.Fatalf("B: Campaign after A resigned: %v", rb.err)
	}
	s.expectLeader(o, rb.g, "B", "B")
	s.unlock(rb.g, "B")
	s.expectNoLeader(o, "after the last leader resigned")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after every leader resigned: %q", ks)
	}
}

// testElectionResign: while A leads and B waits, A resigns (Unlock): A's
// leadership context ends, with ErrReleased, before B's Campaign returns,
// and B's term is above A's.
func testElectionResign(s *suite) {
	a, _ := s.candidate()
	b, _ := s.candidate()
	ga := s.win(a, "A")
	n := len(s.keys())
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	// B's goroutine looks at A's leadership context as soon as its
	// Campaign returns.
	type won struct {
		r     result
		aDone bool
	}
	bres := make(chan won, 1)
	go func() {
		g, err := b.Campaign(ctx, []byte("B"))
		bres <- won{result{g: g, err: err, at: time.Now()}, ga.Context().Err() != nil}
	}()
	if ks, ok := s.waitKeys(keyWait, grows(n)); !ok {
		s.t.Fatalf("B's key did not appear within %v: keys %q", keyWait, ks)
	}
	s.unlock(ga, "A")
	var w won
	select {
	case w = <-bres:
	case <-time.After(s.op + slack):
		s.t.Fatalf("B: Campaign did not return within %v after A resigned", s.op+slack)
	}
	r := w.r
	if r.err != nil {
		s.t.Fatalf("B: Campaign after A resigned: %v", r.err)
	}
	s.track(r.g)
	if !w.aDone {
		s.t.Errorf("B won while A's leadership context was not done: it must end first")
	}
	if cause := context.Cause(ga.Context()); !errors.Is(cause, holdfast.ErrReleased) {
		s.t.Errorf("A's cause after resigning: %v, want holdfast.ErrReleased", cause)
	}
	if r.g.Token() <= ga.Token() {
		s.t.Errorf("B's term %d is not above A's %d", r.g.Token(), ga.Token())
	}
	s.unlock(r.g, "B")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after every leader resigned: %q", ks)
	}
}

// testElectionFailover: while A leads and B waits, A's session is killed:
// A's leadership context ends (cause wrapping ErrLost) within LossNotice,
// B wins within OpTimeout with a higher term, and Leader reports B.
func testElectionFailover(s *suite) {
	a, fa := s.candidate()
	b, _ := s.candidate()
	o, _ := s.candidate()
	ga := s.win(a, "A")
	n := len(s.keys())
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	bres := campaign(ctx, b, "B")
	if ks, ok := s.waitKeys(keyWait, grows(n)); !ok {
		s.t.Fatalf("B's key did not appear within %v: keys %q", keyWait, ks)
	}
	s.waiting(bres, "B: Campaign while A leads")
	fa.Kill()
	killed := time.Now()
	if !waitDone(ga.Context(), s.b.LossNotice) {
		s.t.Errorf("A's leadership context not done %v after its session was killed", s.b.LossNotice)
	} else if cause := context.Cause(ga.Context()); !errors.Is(cause, holdfast.ErrLost) {
		s.t.Errorf("A's cause after its session was killed: %v, want an error matching holdfast.ErrLost", cause)
	}
	r := s.await(bres, s.op+slack, "B: Campaign after A's session was killed")
	if r.err != nil {
		s.t.Fatalf("B: Campaign after A's session was killed: %v, want leadership within %v", r.err, s.op)
	}
	s.t.Logf("B won %v after A's session was killed", time.Since(killed))
	if r.g.Token() <= ga.Token() {
		s.t.Errorf("B's term %d is not above A's %d", r.g.Token(), ga.Token())
	}
	s.expectLeader(o, r.g, "B", "B after the failover")
	s.unlock(r.g, "B")
	if ks, ok := s.waitKeys(settle, empty); !ok {
		s.t.Errorf("keys left after every leader resigned: %q", ks)
	}
}

// testElectionObserveWinners: Observe reports a candidate only once it has
// taken office (its Campaign returned, or would have had its ctx not ended
// while the store made it leader). In each of several rounds A leads while
// B and C wait; B's and C's campaigns are cancelled and, as soon as
// they have returned, A resigns. B and C never lead, so an observer must report A and "no
// leader", never B or C (a queue that reports whichever key is first
// reports a cancelled waiter whose key is not yet removed).
func testElectionObserveWinners(s *suite) {
	const rounds = 8
	o, _ := s.candidate()
	a, _ := s.candidate()
	b, _ := s.candidate()
	c, _ := s.candidate()
	octx, ocancel := context.WithCancel(s.root)
	defer ocancel()
	ch := o.Observe(octx)
	var mu sync.Mutex
	var seen []holdfast.Leader
	done := make(chan struct{})
	go func() {
		defer close(done)
		for l := range ch {
			mu.Lock()
			seen = append(seen, l)
			mu.Unlock()
		}
	}()
	winners := map[string]bool{} // values of candidates that took office
	for i := range rounds {
		va, vb, vc := fmt.Sprintf("A%d", i), fmt.Sprintf("B%d", i), fmt.Sprintf("C%d", i)
		ga := s.win(a, va)
		winners[va] = true
		n := len(s.keys())
		ctx, cancel := s.ctx(s.op)
		bres := campaign(ctx, b, vb)
		if ks, ok := s.waitKeys(keyWait, grows(n)); !ok {
			cancel()
			s.t.Fatalf("B's key did not appear within %v: keys %q", keyWait, ks)
		}
		cres := campaign(ctx, c, vc)
		if ks, ok := s.waitKeys(keyWait, grows(n+1)); !ok {
			cancel()
			s.t.Fatalf("C's key did not appear within %v: keys %q", keyWait, ks)
		}
		// B and C give up; as soon as their Campaigns have returned (their
		// keys may still be on their way out), A resigns. Neither can
		// have won: A held the office throughout.
		cancel()
		for _, w := range []struct {
			ch    <-chan result
			value string
		}{{bres, vb}, {cres, vc}} {
			if r := s.await(w.ch, s.op+slack, w.value+": cancelled Campaign"); r.err == nil {
				s.t.Fatalf("%s won the office while A held it", w.value)
			}
		}
		s.unlock(ga, va)
		// Cleanup is CancelCleanup's and ElectionLeader's to check: here
		// only let it settle before the next round.
		if ks, ok := s.waitKeys(settle, empty); !ok {
			s.t.Logf("keys left %v after round %d: %q", settle, i, ks)
		}
	}
	time.Sleep(300 * time.Millisecond) // let the observer catch up
	ocancel()
	select {
	case <-done:
	case <-time.After(s.op):
		s.t.Fatalf("Observe's channel not closed %v after its context ended", s.op)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, l := range seen {
		if !l.None() && !winners[string(l.Value)] {
			s.t.Errorf("Observe reported %s, a candidate whose Campaign was cancelled and never won; seen %v", describeLeader(l), describeLeaders(seen))
			return
		}
	}
}
