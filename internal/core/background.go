package core

import (
	"context"
	"errors"
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
	retryMinPause = 50 * time.Millisecond
	retryMaxPause = time.Second
	// AttemptTimeout bounds one attempt of a background request, so that an
	// attempt stuck on an unresponsive member gives way to the next one.
	AttemptTimeout = 2 * time.Second
)

// Retry calls attempt until it returns nil or a final error (see Final),
// or ctx ends; each call gets a context bounded by AttemptTimeout. Pauses
// between calls double from 50 ms to 1 s. It returns the last error, or
// ctx's cause if ctx ended first.
func Retry(ctx context.Context, attempt func(context.Context) error) error {
	pause := retryMinPause
	for {
		actx, cancel := context.WithTimeout(ctx, AttemptTimeout)
		err := attempt(actx)
		cancel()
		if err == nil || Final(err) {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
		pause = min(2*pause, retryMaxPause)
	}
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
