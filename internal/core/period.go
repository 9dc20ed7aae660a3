package core

import (
	"context"
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

// CheckPeriod returns an error wrapping holdfast.ErrInvalidArgument if
// period cannot be recorded (its year is not 1000 to 9999, where the
// record's values keep their order as bytes).
func CheckPeriod(period time.Time) error {
	if y := period.UTC().Year(); y < 1000 || y > 9999 {
		return fmt.Errorf("%w: period %v: want a year from 1000 to 9999", holdfast.ErrInvalidArgument, period)
	}
	return nil
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
