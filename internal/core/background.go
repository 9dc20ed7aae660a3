package core

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
)

// Background runs the cleanup work a session owns: releases whose
// confirmation Unlock did not wait for, and the removal of what a failed
// Lock left in the store. Each task runs in a goroutine of its own, only
// while it has work; it stops when its work is done or when the session's
// context ends (then the store frees the session's keys itself). Close waits
// for the tasks with Wait.
type Background struct {
	ctx context.Context

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// NewBackground returns a Background whose tasks stop when ctx ends (pass the
// session's context).
func NewBackground(ctx context.Context) *Background { return &Background{ctx: ctx} }

// Go runs task(ctx) in a goroutine, where ctx ends with the session. It
// returns false, without running task, once Wait has begun.
func (b *Background) Go(task func(ctx context.Context)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		task(b.ctx)
	}()
	return true
}

// Wait refuses new tasks and waits for the running ones. Call it after the
// session's context has ended, so that they stop promptly.
func (b *Background) Wait() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

// Retry bounds: the first pause, the longest pause, and the longest single
// attempt.
const (
	// RetryFirstPause is the first pause of every retry loop (see Backoff).
	RetryFirstPause = 50 * time.Millisecond
	retryMaxPause   = time.Second
	// AttemptTimeout bounds one attempt of a background request, so that an
	// attempt stuck on an unresponsive member gives way to the next one.
	AttemptTimeout = 2 * time.Second
)

// Backoff is how a failed request is retried: the one backoff of the
// backends and leader.Run. The zero Backoff pauses from RetryFirstPause,
// doubling to 1 s, stops on Final errors, and does not bound attempts.
type Backoff struct {
	// Attempt bounds each attempt (0: no bound, for an attempt that blocks
	// on purpose, as a blocking query or a campaign does).
	Attempt time.Duration
	// First and Max bound the pauses (0: RetryFirstPause and 1 s).
	First, Max time.Duration
	// Final reports the errors that retrying cannot change (nil: Final).
	Final func(error) bool
	// Tries bounds the attempts (0: no bound); after the last one, Retry
	// returns its error.
	Tries int
	// Jitter makes each pause random, up to the doubling bound, so that
	// contenders that collided do not collide again at once.
	Jitter bool
}

// Retry calls attempt until it returns nil or a final error, ctx ends, or
// b.Tries attempts were made; pauses between calls double from b.First to
// b.Max. It returns the last error if it is final (so a session's end comes
// before ctx's) or the last attempt's, else ctx's cause once ctx has ended.
func (b Backoff) Retry(ctx context.Context, attempt func(context.Context) error) error {
	pause, most, final := cmp.Or(b.First, RetryFirstPause), cmp.Or(b.Max, retryMaxPause), b.Final
	if final == nil {
		final = Final
	}
	for try := 1; ; try++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if b.Attempt > 0 {
			actx, cancel = context.WithTimeout(ctx, b.Attempt)
		}
		err := attempt(actx)
		cancel()
		if err == nil || final(err) || try == b.Tries {
			return err
		}
		wait := pause
		if b.Jitter {
			wait = rand.N(pause)
		}
		if !Sleep(ctx, wait) {
			return context.Cause(ctx)
		}
		pause = min(2*pause, most)
	}
}

// Sleep waits for d or until ctx ends, and reports whether d elapsed (with
// d <= 0: whether ctx lives).
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Retry is Backoff{Attempt: AttemptTimeout}.Retry: each call of attempt
// gets a context bounded by AttemptTimeout; pauses between calls double
// from 50 ms to 1 s. It returns the last error, or ctx's cause if ctx
// ended first.
func Retry(ctx context.Context, attempt func(context.Context) error) error {
	return Backoff{Attempt: AttemptTimeout}.Retry(ctx, attempt)
}

// Final reports whether err is an answer that retrying the same request
// cannot change: the store refused it (not held, permission, conflict, bad
// input), the grant it acts on is lost, or the session is over (lost, which
// wraps ErrLost, or closed). It is the one definition of a final error:
// every retry loop of the backends and leader.Run stop on it.
func Final(err error) bool {
	for _, e := range []error{
		holdfast.ErrNotHeld, holdfast.ErrPermissionDenied, holdfast.ErrConflict,
		holdfast.ErrInvalidArgument, holdfast.ErrLost, holdfast.ErrSessionClosed,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Bind returns a context that also ends when other ends (with other's
// cause), and the function that releases it.
func Bind(ctx, other context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(other, func() { cancel(context.Cause(other)) })
	return ctx, func() { stop(); cancel(nil) }
}
