package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
)

// Claimer is a once-per-period claim (etcd.Once, consul.Once) as the suite
// drives it.
type Claimer interface {
	// ClaimPeriod claims the period starting at period: a held claim, or
	// an error wrapping holdfast.ErrClaimed at once if the name's claim is
	// taken.
	ClaimPeriod(ctx context.Context, period time.Time) (holdfast.Grant, error)
}

// ClaimerOf is what both backends' Once offer; AsClaimer turns one into a
// Claimer.
type ClaimerOf[G holdfast.Grant] interface {
	ClaimPeriod(ctx context.Context, period time.Time) (G, error)
}

// AsClaimer returns c as a Claimer.
func AsClaimer[G holdfast.Grant](c ClaimerOf[G]) Claimer { return claimer[G]{c} }

type claimer[G holdfast.Grant] struct{ c ClaimerOf[G] }

func (c claimer[G]) ClaimPeriod(ctx context.Context, period time.Time) (holdfast.Grant, error) {
	g, err := c.c.ClaimPeriod(ctx, period)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// claimSchedule is the schedule of the claim properties: the backend's, or a
// default fit for a store with short leases.
func (s *suite) claimSchedule() holdfast.Schedule {
	if s.b.ClaimSchedule != (holdfast.Schedule{}) {
		return s.b.ClaimSchedule
	}
	return holdfast.Schedule{Every: 4 * time.Second, AtLeast: time.Second, AtMost: 2 * time.Second}
}

// claimers returns n claimers of the subtest's name, each on a session of
// its own, and their faults.
func (s *suite) claimers(n int, sched holdfast.Schedule) ([]Claimer, []Faults) {
	s.t.Helper()
	cs := make([]Claimer, n)
	fs := make([]Faults, n)
	for i := range cs {
		c, f := s.b.NewClaimer(s.t, s.name, sched)
		if c == nil {
			s.t.Fatal("Backend.NewClaimer returned a nil Claimer")
		}
		s.faults(f, "NewClaimer")
		cs[i], fs[i] = c, f
	}
	return cs, fs
}

// claimRefusal bounds how long a refused claim may take: it is told at
// once, never queued (a few requests on a loaded machine).
const claimRefusal = 2 * time.Second

// testClaimOnce: 5 claimers claim one period at once: exactly one gets the
// claim (non-zero token, key under the name), the 4 others are refused with
// holdfast.ErrClaimed, each within 2 s. The holder's Unlock waits until
// AtLeast after the claim, and meanwhile a claim of the next period is
// refused (the run stays marked). After it, a claim of the same period is
// refused (the record), a claim of the next period succeeds (within
// ClaimFree) with a higher token, and once it is released nothing is left
// under the name but the record: one key, not the run's.
func testClaimOnce(s *suite) {
	sched := s.claimSchedule()
	cs, _ := s.claimers(5, sched)
	period := sched.Period(time.Now())
	if time.Until(period.Add(sched.Every)) < sched.AtLeast+claimRefusal {
		period = period.Add(sched.Every) // too close to its end: the next one
		time.Sleep(time.Until(period))
	}
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	type result struct {
		g    holdfast.Grant
		err  error
		took time.Duration
	}
	res := make([]result, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			start := time.Now()
			g, err := c.ClaimPeriod(ctx, period)
			res[i] = result{g, err, time.Since(start)}
		})
	}
	wg.Wait()
	made := time.Now()
	var holder holdfast.Grant
	for i, r := range res {
		switch {
		case r.err == nil && holder != nil:
			s.t.Errorf("claimer %d: a second claim of period %v: %s", i, period, describe(r.g))
		case r.err == nil:
			holder = r.g
			s.track(r.g)
		case !errors.Is(r.err, holdfast.ErrClaimed):
			s.t.Errorf("claimer %d: %v, want an error wrapping holdfast.ErrClaimed", i, r.err)
		case r.took > claimRefusal:
			s.t.Errorf("claimer %d: refused after %v, want at once (< %v)", i, r.took, claimRefusal)
		}
	}
	if holder == nil {
		s.t.Fatalf("no claimer of 5 got period %v", period)
	}
	if holder.Token() == 0 || !s.under(holder.Key()) {
		s.t.Errorf("claim %s: want a non-zero token and a key under %q", describe(holder), s.name+"/")
	}
	if err := holder.Context().Err(); err != nil {
		s.t.Errorf("claim context done while held: %v", context.Cause(holder.Context()))
	}
	unlocked := make(chan error, 1)
	go func() { unlocked <- holder.Unlock(ctx) }()
	next := period.Add(sched.Every)
	if sched.AtLeast > 500*time.Millisecond {
		time.Sleep(time.Until(made.Add(sched.AtLeast / 2)))
		if g, err := cs[1].ClaimPeriod(ctx, next); err == nil {
			s.track(g)
			s.t.Errorf("a claim of the next period during the release, %v after the claim (AtLeast %v), succeeded: %s", time.Since(made), sched.AtLeast, describe(g))
		} else if !errors.Is(err, holdfast.ErrClaimed) {
			s.t.Errorf("a claim of the next period during the release: %v, want holdfast.ErrClaimed", err)
		}
	}
	if err := <-unlocked; err != nil {
		s.t.Fatalf("Unlock of the claim: %v", err)
	}
	if took := time.Since(made); took < sched.AtLeast-claimSlop {
		s.t.Errorf("Unlock returned %v after the claim, want no sooner than AtLeast %v", took, sched.AtLeast)
	}
	if !errors.Is(context.Cause(holder.Context()), holdfast.ErrReleased) {
		s.t.Errorf("claim context cause after Unlock: %v, want holdfast.ErrReleased", context.Cause(holder.Context()))
	}
	if g, err := cs[1].ClaimPeriod(ctx, period); err == nil {
		s.track(g)
		s.t.Errorf("a claim of the same period after the release succeeded: %s", describe(g))
	} else if !errors.Is(err, holdfast.ErrClaimed) {
		s.t.Errorf("a claim of the same period after the release: %v, want holdfast.ErrClaimed", err)
	}
	var g holdfast.Grant
	deadline := time.Now().Add(s.b.ClaimFree + claimRefusal)
	for {
		var err error
		if g, err = cs[2].ClaimPeriod(ctx, next); err == nil {
			break
		}
		if !errors.Is(err, holdfast.ErrClaimed) || time.Now().After(deadline) {
			s.t.Fatalf("claim of the next period %v after the first's release and AtLeast (%v) + ClaimFree (%v): %v", next, sched.AtLeast, s.b.ClaimFree, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.track(g)
	if g.Token() <= holder.Token() {
		s.t.Errorf("token of the next claim %d, want more than the first's %d", g.Token(), holder.Token())
	}
	if err := g.Unlock(ctx); err != nil {
		s.t.Errorf("Unlock of the second claim: %v", err)
	}
	if ks, ok := s.waitKeys(s.b.ClaimFree+settle, recordOnly(g.Key())); !ok {
		s.t.Errorf("keys left after the claims were released: %q, want the record only (one key, not %s)", ks, g.Key())
	}
}

// claimSlop is how much sooner than AtLeast Unlock may return (the claim
// was made before the answer reached the suite).
const claimSlop = 200 * time.Millisecond

// recordOnly accepts the keys of a claim that no run holds: at most one
// key (the record), not the run's key run.
func recordOnly(run string) func([]string) bool {
	return func(ks []string) bool { return len(ks) <= 1 && !slices.Contains(ks, run) }
}

// testClaimLate: no period is claimed twice, whatever the delays. A claim
// is made and released (AtLeast 0: once per period must not depend on
// it); past ClaimFree (when a claim that only checks that a key is absent
// would succeed), a late claimer (paused, or held up by a frozen store)
// claims the same period: refused with holdfast.ErrClaimed. A claim of the next period (an early clock), then,
// once released, one of this period: refused (a later period was claimed).
// A claim of a period already over: refused with holdfast.ErrPeriodOver
// (which wraps ErrClaimed). Periods of an hour, so that none ends during
// the property.
func testClaimLate(s *suite) {
	sched := s.claimSchedule()
	sched.Every, sched.AtLeast = time.Hour, 0
	cs, _ := s.claimers(2, sched)
	ctx, cancel := s.ctx(2*s.b.ClaimFree + s.op)
	defer cancel()
	period := sched.Period(time.Now().Add(time.Minute)) // does not end during the property
	over := sched.Period(time.Now()).Add(-sched.Every)
	claimOne := func(c Claimer, p time.Time, what string) holdfast.Grant {
		s.t.Helper()
		var g holdfast.Grant
		deadline := time.Now().Add(s.b.ClaimFree + claimRefusal)
		for {
			var err error
			if g, err = c.ClaimPeriod(ctx, p); err == nil {
				break
			}
			if !errors.Is(err, holdfast.ErrClaimed) || time.Now().After(deadline) {
				s.t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		s.track(g)
		if err := g.Unlock(ctx); err != nil {
			s.t.Fatalf("%s: Unlock: %v", what, err)
		}
		return g
	}
	refused := func(c Claimer, p time.Time, what string, want error) {
		s.t.Helper()
		g, err := c.ClaimPeriod(ctx, p)
		if err == nil {
			s.track(g)
			s.t.Errorf("%s: claimed again: %s", what, describe(g))
		} else if !errors.Is(err, want) {
			s.t.Errorf("%s: %v, want an error wrapping %v", what, err, want)
		}
	}
	first := claimOne(cs[0], period, "first claim of the period")
	ran := time.Now()
	time.Sleep(s.b.ClaimFree)
	refused(cs[1], period, fmt.Sprintf("a claim of the same period %v after the run (ClaimFree %v)", time.Since(ran).Round(time.Millisecond), s.b.ClaimFree), holdfast.ErrClaimed)
	next := claimOne(cs[0], period.Add(sched.Every), "a claim of the next period")
	if next.Token() <= first.Token() {
		s.t.Errorf("token of the next period's claim %d, want more than %d", next.Token(), first.Token())
	}
	refused(cs[1], period, "a claim of this period after the next one's", holdfast.ErrClaimed)
	refused(cs[1], over, "a claim of a period that is over", holdfast.ErrPeriodOver)
}

// testClaimAtMost: a holder cut off from the store right after its claim
// (as good as crashed: it cannot release) keeps the claim: a claim of the
// next period is refused at least until the holder's context has ended (the
// holder is told before anyone else can claim), and succeeds no later than
// AtMost + ClaimFree after the first claim.
func testClaimAtMost(s *suite) {
	sched := s.claimSchedule()
	cs, fs := s.claimers(2, sched)
	ctx, cancel := s.ctx(sched.AtMost + s.b.ClaimFree + s.op)
	defer cancel()
	period := sched.Period(time.Now())
	start := time.Now()
	held, err := cs[0].ClaimPeriod(ctx, period)
	if err != nil {
		s.t.Fatalf("first claim: %v", err)
	}
	s.track(held)
	fs[0].Cut()
	if d := held.Deadline(); d.After(start.Add(sched.AtMost)) {
		s.t.Errorf("claim Deadline %v after the claim was sent, want at most AtMost %v", d.Sub(start), sched.AtMost)
	}
	for i := 1; ; i++ {
		g, err := cs[1].ClaimPeriod(ctx, period.Add(time.Duration(i)*sched.Every))
		if err == nil {
			s.track(g)
			if held.Context().Err() == nil {
				s.t.Errorf("a claim succeeded %v after a crashed holder's claim while that holder's context was still live", time.Since(start))
			}
			if g.Token() <= held.Token() {
				s.t.Errorf("token %d after a crashed holder's %d: want it higher", g.Token(), held.Token())
			}
			return
		}
		if !errors.Is(err, holdfast.ErrClaimed) {
			s.t.Fatalf("claim after a crashed holder: %v", err)
		}
		if time.Since(start) > sched.AtMost+s.b.ClaimFree {
			s.t.Fatalf("a crashed holder's claim still blocks %v after it was made (AtMost %v + ClaimFree %v)", time.Since(start), sched.AtMost, s.b.ClaimFree)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// claimCrash is the period whose winner crashes in testClaimTicks.
const claimCrash = 1

// claimTicks is how many periods testClaimTicks runs: the one before the
// crash, the crash's, and those until the first period that starts after
// the crashed claim's AtMost + ClaimFree, counted from the crash, which
// comes up to the claimers' skew (AtLeast/2) and a claim's round trip (1 s
// allowed) after its period starts: 4 periods with the default schedule
// and etcd's ClaimFree (2.5 s), 7 with Consul's.
func claimTicks(sched holdfast.Schedule, claimFree time.Duration) int {
	after := sched.AtMost + claimFree + sched.AtLeast/2 + time.Second
	return claimCrash + 1 + int((after+sched.Every-1)/sched.Every)
}

// testClaimTicks: 5 claimers fire at every period for claimTicks periods,
// each late by its own offset (its clock or scheduler lags by up to
// AtLeast/2, the tolerated skew); the winner runs 100 ms and releases,
// except in period 1 (claimCrash) where it crashes (is cut off from the store, and
// claims no more). Each period has at most one run; each period that
// starts after the crashed claim's AtMost + ClaimFree (at least the last),
// and every period before the crash, has exactly one.
func testClaimTicks(s *suite) {
	sched := s.claimSchedule()
	ticks := claimTicks(sched, s.b.ClaimFree)
	cs, fs := s.claimers(5, sched)
	ctx, cancel := s.ctx(time.Duration(ticks)*sched.Every + s.op)
	defer cancel()
	skew := sched.AtLeast / 2
	first := sched.Period(time.Now()).Add(sched.Every)
	var (
		mu      sync.Mutex
		runs    = map[int]int{}
		crashed time.Time
		errs    errList
		wg      sync.WaitGroup
	)
	for i, c := range cs {
		offset := time.Duration(rand.Int64N(int64(skew) + 1))
		wg.Go(func() {
			for k := range ticks {
				p := first.Add(time.Duration(k) * sched.Every)
				select {
				case <-time.After(time.Until(p.Add(offset))):
				case <-ctx.Done():
					return
				}
				g, err := c.ClaimPeriod(ctx, p)
				if errors.Is(err, holdfast.ErrClaimed) {
					continue
				}
				if err != nil {
					errs.add("claimer %d, period %d: %v", i, k, err)
					continue
				}
				s.track(g)
				mu.Lock()
				runs[k]++
				crash := k == claimCrash
				if crash {
					crashed = time.Now()
				}
				mu.Unlock()
				if crash {
					fs[i].Cut()
					return
				}
				time.Sleep(100 * time.Millisecond)
				if err := g.Unlock(ctx); err != nil {
					errs.add("claimer %d, period %d: Unlock: %v", i, k, err)
				}
			}
		})
	}
	wg.Wait()
	errs.report(s.t)
	for k := range ticks {
		p := first.Add(time.Duration(k) * sched.Every)
		free := k < claimCrash || (!crashed.IsZero() && p.After(crashed.Add(sched.AtMost+s.b.ClaimFree)))
		switch n := runs[k]; {
		case n > 1:
			s.t.Errorf("period %d (%v): %d runs, want at most 1", k, p, n)
		case n == 0 && free:
			s.t.Errorf("period %d (%v): no run, though no claim could block it", k, p)
		}
	}
	s.t.Logf("runs per period: %v (5 claimers, skew up to %v, crash in period %d, %d periods)", fmt.Sprint(runs), skew, claimCrash, ticks)
}
