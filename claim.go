package holdfast

import (
	"errors"
	"fmt"
	"time"
)

// ErrClaimed is returned by a once-per-period claim (etcd.Once, consul.Once)
// when the name's claim is taken: by another claimant of the same period, or
// by the run of an earlier period that still holds it (then the period is
// skipped, as with Temporal's default overlap policy). It is returned at
// once; claimants never queue.
var ErrClaimed = errors.New("holdfast: already claimed")

// Schedule is the timing of a once-per-period claim. The periods are the
// intervals [k*Every, (k+1)*Every) of Unix time (UTC; leap seconds ignored,
// as Go does), so every replica derives the same period from its own wall
// clock without talking to the others.
type Schedule struct {
	// Every is the length of a period (required, > 0).
	Every time.Duration
	// AtLeast is how long a claim stays taken after it was made, even when
	// its holder releases it sooner (0 to AtMost). A replica whose clock or
	// scheduler is late by less than AtLeast therefore finds the period
	// taken and does not run it again. Keep AtLeast + skew < Every, or a
	// claim can still hold when the next period's claimants come.
	AtLeast time.Duration
	// AtMost is the longest a claim lasts in the store if its holder never
	// releases it (it crashed): the store frees it by then, so a dead
	// holder does not block later periods. The holder is told earlier
	// (its grant's context ends before the store may free the claim).
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
