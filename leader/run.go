package leader

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// Defaults of Config.
const (
	// DefaultRetryMin is the first pause after a failed campaign (the
	// first pause of every retry in holdfast).
	DefaultRetryMin = core.RetryFirstPause
	// DefaultRetryMax bounds the pause after failed campaigns (it doubles
	// from RetryMin).
	DefaultRetryMax = 5 * time.Second
	// DefaultResignTimeout bounds the resignation when ctx ends (see
	// Config.ResignOnCancel).
	DefaultResignTimeout = 5 * time.Second
)

// Config is what Run does with leadership. G is the backend's grant type
// (*etcd.Grant, *consul.Grant), so callbacks make guarded writes without a
// type assertion.
type Config[G holdfast.Grant] struct {
	// Value is what the candidate publishes while it leads (its address,
	// say): Leader and Observe report it.
	Value []byte

	// OnStartedLeading runs the leader's work; it is required. ctx is the
	// leadership's context (g.Context(), ended with Run's ctx too): it is
	// cancelled when leadership is lost, before another candidate can win
	// (see holdfast.Grant.Context). It should return promptly once ctx is
	// done; Run waits for it before it calls OnStoppedLeading and before it
	// campaigns again. If it returns while still leading, Run resigns (the
	// term is over) and campaigns again after RetryMin.
	OnStartedLeading func(ctx context.Context, g G)

	// OnStoppedLeading, if set, is called after each OnStartedLeading has
	// returned, with the grant whose leadership ended;
	// context.Cause(g.Context()) says why (holdfast.ErrReleased after a
	// resignation, an error wrapping holdfast.ErrLost after a loss).
	OnStoppedLeading func(g G)

	// OnNewLeader, if set, is called for every leader change the candidate
	// observes (see Candidate.Observe), in order, with the zero
	// holdfast.Leader for "no leader", from one goroutine, starting with
	// the current state. It runs concurrently with the other callbacks.
	OnNewLeader func(l holdfast.Leader)

	// ResignOnCancel makes Run resign when ctx ends while it leads, so that
	// another candidate can win at once (bounded by ResignTimeout).
	// Otherwise the leadership stays in the store until the session ends
	// (Close or expiry), though OnStartedLeading's ctx is cancelled either
	// way.
	ResignOnCancel bool

	// ResignTimeout bounds the resignation when ctx ends (default
	// DefaultResignTimeout).
	ResignTimeout time.Duration

	// RetryMin and RetryMax bound the pause after a failed campaign (an
	// unreachable store, say): it starts at RetryMin and doubles up to
	// RetryMax. Defaults: DefaultRetryMin, DefaultRetryMax.
	RetryMin, RetryMax time.Duration
}

// validate checks cfg and fills in defaults.
func (cfg *Config[G]) validate() error {
	var errs []error
	if cfg.OnStartedLeading == nil {
		errs = append(errs, errors.New("OnStartedLeading is nil"))
	}
	if cfg.RetryMin == 0 {
		cfg.RetryMin = DefaultRetryMin
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = max(DefaultRetryMax, cfg.RetryMin)
	}
	if cfg.ResignTimeout == 0 {
		cfg.ResignTimeout = DefaultResignTimeout
	}
	switch {
	case cfg.RetryMin < 0:
		errs = append(errs, fmt.Errorf("RetryMin %v is negative", cfg.RetryMin))
	case cfg.RetryMax < cfg.RetryMin:
		errs = append(errs, fmt.Errorf("RetryMax %v is below RetryMin %v", cfg.RetryMax, cfg.RetryMin))
	}
	if cfg.ResignTimeout < 0 {
		errs = append(errs, fmt.Errorf("ResignTimeout %v is negative", cfg.ResignTimeout))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: leader.Config: %w", holdfast.ErrInvalidArgument, errors.Join(errs...))
	}
	return nil
}

// Run campaigns for leadership with c until ctx ends: each time it wins, it
// calls cfg.OnStartedLeading under the leadership's context, then
// cfg.OnStoppedLeading once that has returned, and campaigns again.
// cfg.OnNewLeader follows every leader change meanwhile.
//
// Run returns nil when ctx ends (after OnStartedLeading has returned, the
// resignation if ResignOnCancel, and the last OnNewLeader call), at once an
// error wrapping holdfast.ErrInvalidArgument if c or cfg is invalid, and
// an error that campaigning again cannot fix: the session's end
// (holdfast.ErrSessionLost, holdfast.ErrSessionClosed: Run does not open
// sessions), holdfast.ErrConflict (the name is used by another kind of
// lock), holdfast.ErrPermissionDenied, holdfast.ErrInvalidArgument. Other
// campaign errors (an unreachable store) are retried after RetryMin,
// doubling to RetryMax.
//
// Leaderships never overlap in one Run: a term ends (its context is
// cancelled) before the candidate campaigns again, and the store cancels a
// lost leader's context before another candidate can win, so across Runs
// on the same name the terms, the grants' tokens, strictly increase: use
// them as fencing tokens for the leader's writes.
func Run[G holdfast.Grant](ctx context.Context, c Candidate[G], cfg Config[G]) error {
	if ctx == nil {
		return fmt.Errorf("%w: leader.Run: nil context", holdfast.ErrInvalidArgument)
	}
	if isNil(c) {
		return fmt.Errorf("%w: leader.Run: nil candidate", holdfast.ErrInvalidArgument)
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	var observers sync.WaitGroup
	if cfg.OnNewLeader != nil {
		octx, stop := context.WithCancel(ctx)
		defer func() { stop(); observers.Wait() }()
		ch := c.Observe(octx)
		observers.Add(1)
		go func() {
			defer observers.Done()
			for l := range ch {
				cfg.OnNewLeader(l)
			}
		}()
	}
	backoff := core.Backoff{First: cfg.RetryMin, Max: cfg.RetryMax, Final: final}
	for ctx.Err() == nil {
		var g G
		err := backoff.Retry(ctx, func(ctx context.Context) (err error) {
			g, err = c.Campaign(ctx, cfg.Value)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("leader.Run %s: %w", c.Name(), err)
		}
		lead(ctx, g, &cfg)
		if ctx.Err() == nil && g.Context().Err() != nil && errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) {
			// OnStartedLeading returned while leading: pause before the
			// next campaign, so that a callback that returns at once does
			// not spin.
			core.Sleep(ctx, cfg.RetryMin)
		}
	}
	return nil
}

// lead runs one term: OnStartedLeading under the leadership's context
// until it returns, the resignation it calls for (its return, or ctx's end
// with ResignOnCancel), then OnStoppedLeading.
func lead[G holdfast.Grant](ctx context.Context, g G, cfg *Config[G]) {
	lctx, cancel := context.WithCancelCause(g.Context())
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	cfg.OnStartedLeading(lctx, g)
	stop()
	cancel(nil)
	if g.Context().Err() == nil && (ctx.Err() == nil || cfg.ResignOnCancel) {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ResignTimeout)
		_ = g.Unlock(rctx) // a failure is retried by the session
		rcancel()
	}
	if cfg.OnStoppedLeading != nil {
		cfg.OnStoppedLeading(g)
	}
}

// final reports whether a campaign error will not go away by campaigning
// again: a final error (core.Final), except the loss of the key the
// campaign itself had put (ErrLost, ErrNotHeld), which the next campaign
// puts afresh. The session's loss (ErrSessionLost wraps ErrLost) is final.
func final(err error) bool {
	if errors.Is(err, holdfast.ErrSessionLost) {
		return true
	}
	return core.Final(err) && !errors.Is(err, holdfast.ErrLost) && !errors.Is(err, holdfast.ErrNotHeld)
}

// isNil reports whether c is nil, or an interface holding a nil pointer.
func isNil[G holdfast.Grant](c Candidate[G]) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
