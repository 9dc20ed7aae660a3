package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/mutant"
)

// ErrPastSafeDeadline is why a Keeper ended its session at its safe
// deadline (wrapped with holdfast.ErrSessionLost): no renewal was
// acknowledged in time. The store may still keep the session until its own
// expiry; only holdfast gave it up.
var ErrPastSafeDeadline = errors.New("no renewal acknowledged before the safe deadline (TTL minus margin after the last acknowledged renewal was sent)")

// Keeper tracks the safe local deadline of a session: the moment after which
// the store may have expired the session, computed from when the last
// acknowledged renewal was *sent* (not when its answer arrived), minus a
// margin. Its context is cancelled at that deadline, or earlier by End.
//
// Time is measured with Go's monotonic clock, so wall-clock jumps do not
// move the deadline; what remains assumed is that the local clock and the
// store's clock run at rates that differ by less than margin/TTL.
type Keeper struct {
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time
	timer    *time.Timer
	ended    bool // no renewal counts any more
	reported bool // SessionEnded was sent

	observers []holdfast.Observer // set before any grant (SetObservers)
}

// NewKeeper returns a Keeper whose deadline is sent+ttl-margin: pass the time
// the session-creating request was sent and the TTL the store granted.
func NewKeeper(sent time.Time, ttl, margin time.Duration) *Keeper {
	k := &Keeper{}
	k.ctx, k.cancel = context.WithCancelCause(context.Background())
	k.deadline = sent.Add(clientTime(ttl - marginOf(margin)))
	k.mu.Lock() // the timer may fire before AfterFunc returns
	k.timer = time.AfterFunc(time.Until(k.deadline), k.fire)
	k.mu.Unlock()
	return k
}

// Context is cancelled when the session ends; its cause says why.
func (k *Keeper) Context() context.Context { return k.ctx }

// Deadline returns the current safe deadline.
func (k *Keeper) Deadline() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.deadline
}

// Renewed records a renewal sent at sent and acknowledged with ttl. The
// deadline only moves forward. It returns false if the Keeper has already
// ended (a late acknowledgement cannot revive a session whose holders have
// been told it is lost).
func (k *Keeper) Renewed(sent time.Time, ttl, margin time.Duration) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ended {
		return false
	}
	if d := sent.Add(clientTime(ttl - marginOf(margin))); d.After(k.deadline) {
		k.deadline = d
		k.timer.Reset(time.Until(d))
	}
	return true
}

func (k *Keeper) fire() { k.expire() }

// Check ends the session now if its safe deadline has passed on the
// monotonic clock, without waiting for the timer (which fires late after
// the process was paused), and returns Err. Every read of a grant's state
// goes through it.
func (k *Keeper) Check() error {
	if k.ctx.Err() == nil && !mutant.On("core/sync-deadline") {
		k.expire()
	}
	return k.Err()
}

// expire ends the session if its deadline has passed.
func (k *Keeper) expire() {
	k.mu.Lock()
	passed := !k.ended && !time.Now().Before(k.deadline)
	k.mu.Unlock()
	if passed {
		k.End(fmt.Errorf("%w: %w", holdfast.ErrSessionLost, ErrPastSafeDeadline))
	}
}

// End ends the session with cause (the first cause wins) and stops the timer.
// No renewal counts after End has begun.
func (k *Keeper) End(cause error) {
	k.mu.Lock()
	k.ended = true
	k.timer.Stop()
	report := !k.reported
	k.reported = true
	k.mu.Unlock()
	k.cancel(cause)
	if report {
		cause := context.Cause(k.ctx) // the first cause
		if errors.Is(cause, holdfast.ErrSessionClosed) {
			// The grants' contexts end with ErrLost and ErrSessionClosed
			// (their code must stop), but a Close is not a loss.
			cause = holdfast.ErrSessionClosed
		}
		for _, o := range k.observers {
			o.SessionEnded(cause)
		}
	}
}

// SetObservers sets the session's observers. Call it once, right after
// NewKeeper, before the session hands out anything.
func (k *Keeper) SetObservers(obs ...holdfast.Observer) {
	for _, o := range obs {
		if o != nil {
			k.observers = append(k.observers, o)
		}
	}
}

// RenewalFailed reports a failed renewal to the observers.
func (k *Keeper) RenewalFailed(err error) {
	for _, o := range k.observers {
		o.RenewalFailed(err)
	}
}

// Waiting reports that an acquisition of name began, and returns the
// function that reports its end.
func (k *Keeper) Waiting(name string) (end func()) {
	if len(k.observers) == 0 {
		return func() {}
	}
	for _, o := range k.observers {
		o.Waiting(name, 1)
	}
	return func() {
		for _, o := range k.observers {
			o.Waiting(name, -1)
		}
	}
}

// Err returns nil while the session lives, and its cause after.
func (k *Keeper) Err() error {
	if k.ctx.Err() == nil {
		return nil
	}
	return context.Cause(k.ctx)
}

// marginOf is margin, or 0 in the mutant build that removes the margin.
func marginOf(margin time.Duration) time.Duration {
	if mutant.On("core/margin") {
		return 0
	}
	return margin
}

// Margin returns the safety margin of a session with the given TTL: margin if
// set, else TTL/5. It must lie between 0 and TTL/2, so that renewals every
// TTL/3 leave room for a retry before the deadline; otherwise the error wraps
// holdfast.ErrInvalidTTL.
func Margin(ttl, margin time.Duration, set bool) (time.Duration, error) {
	if !set {
		margin = ttl / 5
	}
	if margin < 0 || margin > ttl/2 {
		return 0, fmt.Errorf("%w: margin %v is not between 0 and half the TTL %v", holdfast.ErrInvalidTTL, margin, ttl)
	}
	return margin, nil
}
