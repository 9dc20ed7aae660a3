package holdfast

import (
	"errors"
	"fmt"
	"time"
)

// ErrClaimed is returned by a once-per-period claim (etcd.Once, consul.Once)
// when the period may not run here: it was claimed already (by another
// claimant, or by this one), a later period was claimed already, or the
// run of an earlier period still holds the name (then the period is
// skipped, as with Temporal's default overlap policy). It is returned at
// once; claimants never queue.
var ErrClaimed = errors.New("holdfast: already claimed")

// ErrPeriodOver is returned by a once-per-period claim whose period was
// over (by this process's clock) before the claim was made: asked for a
// period that had ended, or answered by the store after its end (a pause,
// a slow or frozen store). Nothing runs: if the store recorded the claim,
// the period counts as claimed and is skipped. It wraps ErrClaimed.
var ErrPeriodOver error = &named{ErrClaimed, "holdfast: the period was over before it was claimed"}

// Schedule is the timing of a once-per-period claim. The periods are the
// intervals [k*Every, (k+1)*Every) of Unix time (UTC; leap seconds ignored,
// as Go does), so every replica derives the same period from its own wall
// clock without talking to the others.
//
// The store records the last period claimed under the name, and keeps that
// record when the run ends: a claim of that period or of an earlier one is
// refused, whatever the delays, so no period runs twice and AtLeast is not
// needed for that. A claim answered after its period is over does not run
// (ErrPeriodOver).
type Schedule struct {
	// Every is the length of a period (required, > 0).
	Every time.Duration
	// AtLeast is how long a run stays marked as running after the claim
	// was made, even when its holder releases it sooner (0, the default,
	// to AtMost): Unlock waits until then. A claim of a later period is
	// refused while a run is marked, so AtLeast keeps a replica whose clock
	// runs early (or whose cron fires early) from starting the next
	// period's run less than AtLeast after this one's. It does not guard
	// against a period running twice: the record does.
	AtLeast time.Duration
	// AtMost is the longest a run stays marked in the store if its holder
	// never releases it (it crashed): the store ends the mark by then, so
	// a dead holder does not block later periods. The holder is told
	// earlier (its grant's context ends before the store may end the mark).
	// Required, > 0; stores have a floor of their own (etcd: 2 s; Consul:
	// 20 s, twice its shortest session TTL).
	AtMost time.Duration
}

// Validate returns an error wrapping ErrInvalidArgument if s is not usable.
func (s Schedule) Validate() error {
	switch {
	case s.Every <= 0:
		return fmt.Errorf("%w: schedule: Every %v must be positive", ErrInvalidArgument, s.Every)
	case s.AtMost <= 0:
		return fmt.Errorf("%w: schedule: AtMost %v must be positive", ErrInvalidArgument, s.AtMost)
	case s.AtLeast < 0 || s.AtLeast > s.AtMost:
		return fmt.Errorf("%w: schedule: AtLeast %v must lie between 0 and AtMost %v", ErrInvalidArgument, s.AtLeast, s.AtMost)
	}
	return nil
}

// Period returns the start of the period that t falls in: t rounded down to a
// multiple of Every since the Unix epoch, in UTC.
func (s Schedule) Period(t time.Time) time.Time {
	if s.Every <= 0 {
		return t.UTC()
	}
	ns := t.UnixNano()
	r := ns % int64(s.Every)
	if r < 0 {
		r += int64(s.Every)
	}
	return time.Unix(0, ns-r).UTC()
}
