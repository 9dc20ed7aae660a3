package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/holdfast/holdfast"
)

// periodLayout is the value of a claim record: a period's start, UTC, with
// a fixed width, so that comparing two values as bytes (etcd's Compare on a
// value) compares the periods.
const periodLayout = "2006-01-02T15:04:05.000000000Z"

// FormatPeriod returns the claim record's value for period.
func FormatPeriod(period time.Time) string { return period.UTC().Format(periodLayout) }

// ParsePeriod parses a claim record's value; ok is false if v is not one
// (a claim key of an older holdfast holds JSON).
func ParsePeriod(v []byte) (period time.Time, ok bool) {
	if len(v) != len(periodLayout) {
		return time.Time{}, false
	}
	t, err := time.Parse(periodLayout, string(v))
	return t, err == nil
}

// CheckPeriod checks ClaimPeriod's arguments and returns period in UTC:
// an error wrapping holdfast.ErrInvalidArgument if ctx is nil or period
// cannot be recorded (its year is not 1000 to 9999, where the record's
// values keep their order as bytes).
func CheckPeriod(ctx context.Context, period time.Time) (time.Time, error) {
	if ctx == nil {
		return period, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if y := period.UTC().Year(); y < 1000 || y > 9999 {
		return period, fmt.Errorf("%w: period %v: want a year from 1000 to 9999", holdfast.ErrInvalidArgument, period)
	}
	return period.UTC(), nil
}

// WaitAtLeast waits until the earlier of until and g's deadline, while g is
// held and ctx lives (a claim's Unlock keeps the run marked until AtLeast).
func WaitAtLeast(ctx context.Context, g *Grant, until time.Time) {
	if d := g.Deadline(); d.Before(until) {
		until = d
	}
	wait := time.Until(until)
	if wait <= 0 || !g.Held() {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-g.Context().Done():
	}
}

// CheckOnce checks NewOnce's arguments, either backend's, before any
// request: a session (hasSession), a valid name and schedule, and AtMost
// from least to most, the store's bounds.
func CheckOnce(hasSession bool, name string, sched holdfast.Schedule, least, most time.Duration) error {
	if !hasSession {
		return fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return err
	}
	if err := sched.Validate(); err != nil {
		return err
	}
	if sched.AtMost < least || sched.AtMost > most {
		return fmt.Errorf("%w: AtMost %v is not between %v and %v (the store's bounds)", holdfast.ErrInvalidArgument, sched.AtMost, least, most)
	}
	return nil
}

// PeriodOver is the error of a claim of name's period made after its end.
func PeriodOver(name string, period time.Time, every time.Duration) error {
	return fmt.Errorf("%w: %s for period %s (ended at %s)", holdfast.ErrPeriodOver, name, period.Format(time.RFC3339), period.Add(every).Format(time.RFC3339))
}

// ClaimFail is the error of a failed claim, after prefix ("holdfast/<store>:
// claim <name>..."): the session's end (ended, if not nil), ctx's, or err.
func ClaimFail(ctx context.Context, prefix string, ended, err error) error {
	switch {
	case ended != nil:
		return fmt.Errorf("%s: %w", prefix, ended)
	case ctx.Err() != nil && !errors.Is(err, ctx.Err()):
		return fmt.Errorf("%s: %w (%v)", prefix, ctx.Err(), err)
	}
	return fmt.Errorf("%s: %w", prefix, err)
}

// ClaimCleanup bounds the first attempt of Dispose, so that nothing is left
// when the process exits right after.
const ClaimCleanup = 2 * time.Second

// Dispose removes what a claim did not use (its lease or session, which
// expires anyway) by remove: now, within ClaimCleanup (ctx's values, not
// its end); if that fails, retried with b in bg, for at most within (0: no
// bound).
func Dispose(ctx context.Context, bg *Background, b Backoff, within time.Duration, remove func(context.Context) error) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ClaimCleanup)
	err := remove(dctx)
	cancel()
	if err == nil {
		return
	}
	bg.Go(func(ctx context.Context) {
		if within > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, within)
			defer cancel()
		}
		_ = b.Retry(ctx, remove)
	})
}

// ClaimGrant returns the grant of a claim's run mark key, made with a lease
// or session of its own of ttl asked for at sent, never renewed: its
// deadline is sent + ttl - ttl/5; it ends with the holdfast session (whose
// keeper is session) or through rel.
func ClaimGrant(session *Keeper, bg *Background, key string, token holdfast.Token, sent time.Time, ttl time.Duration, rel Releaser) *Grant {
	keeper := NewKeeper(sent, ttl, ttl/5)
	endWithSession := context.AfterFunc(session.Context(), func() { keeper.End(context.Cause(session.Context())) })
	return NewGrant(keeper, bg, key, token, rel, func() {
		endWithSession()
		keeper.End(holdfast.ErrReleased) // stops its timer; the grant ended already
	})
}

// UnlockClaim is a claim's Unlock: it waits until atLeast (see
// WaitAtLeast), then releases g.
func UnlockClaim(ctx context.Context, g *Grant, atLeast time.Time) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	WaitAtLeast(ctx, g, atLeast)
	return g.Unlock(ctx)
}
