package conformance_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/conformance"
	"github.com/holdfast/holdfast/internal/core"
)

// Bugs of the fake's once-per-period claim.
const (
	bugClaimTwice      = "claim-twice"       // every claimant gets the claim: keys per claimant, no exclusion
	bugClaimQueues     = "claim-queues"      // a claimant of a taken name waits for it instead of being refused
	bugClaimNoAtLeast  = "claim-no-atleast"  // Unlock ends the run's mark at once, before AtLeast
	bugClaimToldLate   = "claim-told-late"   // the holder's context ignores AtMost: the store frees the claim first
	bugClaimStuck      = "claim-stuck"       // a crashed holder's claim never expires
	bugClaimForgets    = "claim-forgets"     // the record goes with the run: a period is claimed again once its run ended (holdfast before the record)
	bugClaimPastPeriod = "claim-past-period" // a claim of a period that is over is granted
)

// newClaimer returns a once-per-period claim called name on a new session
// of the fake store: the record <name>/.claim (the last period claimed,
// kept for ever) and the run's mark <name>/.run (the store's revision as
// token), deleted AtMost after it was made, or at AtLeast after it was
// made once released.
func (st *fakeStore) newClaimer(t *testing.T, name string, sched holdfast.Schedule) (conformance.Claimer, conformance.Faults) {
	t.Helper()
	if err := holdfast.ValidateName(name); err != nil {
		t.Fatalf("fake: %v", err)
	}
	if err := sched.Validate(); err != nil {
		t.Fatalf("fake: %v", err)
	}
	s := st.newSession()
	t.Cleanup(s.close)
	c := &fakeClaimer{st: st, sess: s, name: name, sched: sched}
	return c, conformance.Faults{
		Kill:     func() { s.keeper.End(fmt.Errorf("%w: session %s killed", holdfast.ErrSessionLost, s.id)) },
		Cut:      func() { s.setNet(netDown) },
		Freeze:   func() { s.setNet(netDown) },
		Mend:     func() { s.setNet(netUp) },
		Close:    s.close,
		Requests: s.requests.Load,
	}
}

type fakeClaimer struct {
	st    *fakeStore
	sess  *fakeSession
	name  string
	sched holdfast.Schedule
}

// ClaimPeriod implements conformance.Claimer.
func (c *fakeClaimer) ClaimPeriod(ctx context.Context, period time.Time) (holdfast.Grant, error) {
	st := c.st
	record, run := c.name+"/.claim", c.name+"/.run"
	if st.bug == bugClaimTwice {
		record, run = record+"/"+c.sess.id, run+"/"+c.sess.id
	}
	if st.bug != bugClaimPastPeriod && !time.Now().Before(period.Add(c.sched.Every)) {
		return nil, fmt.Errorf("%w: %s for period %v", holdfast.ErrPeriodOver, c.name, period)
	}
	for {
		if err := c.sess.call(ctx, false); err != nil {
			return nil, err
		}
		st.mu.Lock()
		_, running := st.keys[run]
		rec := st.keys[record]
		var last time.Time
		if rec != nil {
			last, _ = core.ParsePeriod(rec.value)
		}
		if st.bug == bugClaimForgets && !running {
			rec = nil
		}
		if !running && (rec == nil || last.Before(period)) {
			break
		}
		ch := st.changed
		st.mu.Unlock()
		if st.bug != bugClaimQueues {
			return nil, fmt.Errorf("%w: %s for period %v", holdfast.ErrClaimed, c.name, period)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	st.rev++
	st.keys[record] = &fakeEntry{key: record, name: c.name, seq: st.rev, value: []byte(core.FormatPeriod(period))}
	e := &fakeEntry{key: run, name: c.name, seq: st.rev, held: true, token: holdfast.Token(st.rev)}
	st.keys[run] = e
	st.notifyLocked()
	st.mu.Unlock()
	made := time.Now()
	if st.bug != bugClaimStuck {
		time.AfterFunc(c.sched.AtMost, func() { st.delete(run, e) })
	}
	ttl := c.sched.AtMost
	if st.bug == bugClaimToldLate {
		ttl = time.Hour
	}
	keeper := core.NewKeeper(made, ttl, ttl/5)
	release := func(ctx context.Context) error {
		if err := c.sess.call(ctx, false); err != nil {
			return err
		}
		st.delete(run, e)
		return nil
	}
	g := core.NewGrant(keeper, c.sess.bg, run, e.token, core.ReleaseFunc(release), func() { keeper.End(holdfast.ErrReleased) })
	if st.bug == bugClaimNoAtLeast {
		return g, nil
	}
	return atLeast{g, made.Add(c.sched.AtLeast)}, nil
}

// atLeast is a fake claim whose Unlock waits until AtLeast, as the
// backends' do.
type atLeast struct {
	*core.Grant
	until time.Time
}

func (g atLeast) Unlock(ctx context.Context) error {
	core.WaitAtLeast(ctx, g.Grant, g.until)
	return g.Grant.Unlock(ctx)
}
