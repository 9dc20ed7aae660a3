//go:build holdfast_mutants

package core

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast"
)

// clockRate is the rate of this process's clock relative to the store's
// (float64 bits; 0 means 1), in the build with the tag holdfast_mutants only.
var clockRate atomic.Uint64

// SetClockRate makes this process's clock run at rate (0 < rate <= 1) relative
// to the store's, for the sessions' deadlines computed from now on: at 0.85
// the client counts 0.85 s while the store counts 1 s, the case the margin
// exists for. It exists only in the build with the tag holdfast_mutants (the
// safety suite's clock-rate scenario); rate 1 restores the real clock.
// Any other rate is refused with an error wrapping holdfast.ErrInvalidArgument.
func SetClockRate(rate float64) error {
	if !(rate > 0 && rate <= 1) {
		return fmt.Errorf("%w: clock rate %v is not in (0, 1]", holdfast.ErrInvalidArgument, rate)
	}
	clockRate.Store(math.Float64bits(rate))
	return nil
}

// clientTime is how long a duration d, counted on this process's clock,
// lasts in real time when this clock runs at the set rate: d / rate. The
// Keeper's deadline (TTL minus margin after a renewal was sent, counted on
// the client's clock) falls that much later on the store's clock.
func clientTime(d time.Duration) time.Duration {
	r := math.Float64frombits(clockRate.Load())
	if r == 0 {
		return d
	}
	return time.Duration(float64(d) / r)
}
