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
	bugClaimTwice     = "claim-twice"      // every claimant gets the claim: keys per claimant, no exclusion
	bugClaimQueues    = "claim-queues"     // a claimant of a taken name waits for it instead of being refused
	bugClaimNoAtLeast = "claim-no-atleast" // Unlock frees the claim at once, before AtLeast
	bugClaimToldLate  = "claim-told-late"  // the holder's context ignores AtMost: the store frees the claim first
	bugClaimStuck     = "claim-stuck"      // a crashed holder's claim never expires
)

// newClaimer returns a once-per-period claim called name on a new session
// of the fake store: the key <name>/.claim, created only if absent (with
// the store's revision as token), deleted AtMost after it was made, or at
// AtLeast after it was made once released.
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
	key := c.name + "/.claim"
	if st.bug == bugClaimTwice {
		key += "/" + c.sess.id
	}
	for {
		if err := c.sess.call(ctx, false); err != nil {
			return nil, err
		}
		st.mu.Lock()
		if _, taken := st.keys[key]; !taken {
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
	e := &fakeEntry{key: key, name: c.name, seq: st.rev, held: true, token: holdfast.Token(st.rev)}
	st.keys[key] = e
	st.notifyLocked()
	st.mu.Unlock()
	made := time.Now()
	if st.bug != bugClaimStuck {
		time.AfterFunc(c.sched.AtMost, func() { st.delete(key, e) })
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
		rest := c.sched.AtLeast - time.Since(made)
		if rest <= 0 || st.bug == bugClaimNoAtLeast {
			st.delete(key, e)
		} else {
			time.AfterFunc(rest, func() { st.delete(key, e) })
		}
		return nil
	}
	return core.NewGrant(keeper, c.sess.bg, key, e.token, release, func() { keeper.End(holdfast.ErrReleased) }), nil
}
