package semaphore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/holdfast/holdfast"
)

// unlockTimeout bounds how long a task waits for the store to confirm the
// release of its permit before it frees its locker for the next task. If
// the store does not answer by then, the session goes on releasing in the
// background, and the next Lock through that locker waits for it.
const unlockTimeout = 5 * time.Second

// Group runs functions, each under a permit of one store-held semaphore
// (or any holdfast.Locker), at most one per locker at a time.
//
// A Group must be made with NewGroup, and must not be copied after first
// use. Its methods are safe for concurrent use. It serves one batch of work:
// once Wait has returned, its context is done, and functions passed to Go
// after that are not called (their error is the failed wait for a permit).
type Group struct {
	parent context.Context         // the context given to NewGroup
	ctx    context.Context         // cancelled by the first error or Wait
	cancel context.CancelCauseFunc // cancels ctx; called before a failed permit's release
	eg     *errgroup.Group

	errOnce sync.Once
	err     error // the first error, recorded before its permit is released

	mu   sync.Mutex
	free []holdfast.Locker // lockers not in use by a running task
}

// NewGroup returns a Group that takes its permits through lockers, and its
// context, derived from ctx, as errgroup.WithContext does: the context is
// cancelled (with the error as its cause) the first time a function passed
// to Go returns an error, or when Wait returns, whichever comes first.
//
// The number of lockers bounds how many functions of this Group run, or
// wait for a permit, at once (see the package doc: a session holds at
// most one permit of a name, so give each locker a session of its own).
// The store's limit bounds how many run across every client of the
// semaphore. Lockers must not be shared with other Groups or other code
// while the Group is in use. Any holdfast.Locker works: with a Mutex
// behind every locker, the store's limit is 1.
//
// It returns an error wrapping holdfast.ErrInvalidArgument if ctx is nil,
// no locker is given, or one of them is nil.
func NewGroup(ctx context.Context, lockers ...holdfast.Locker) (*Group, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if len(lockers) == 0 {
		return nil, fmt.Errorf("%w: semaphore.NewGroup needs at least one locker", holdfast.ErrInvalidArgument)
	}
	for i, l := range lockers {
		if l == nil {
			return nil, fmt.Errorf("%w: locker %d is nil", holdfast.ErrInvalidArgument, i)
		}
	}
	eg, ectx := errgroup.WithContext(ctx)
	eg.SetLimit(len(lockers))
	gctx, cancel := context.WithCancelCause(ectx)
	return &Group{parent: ctx, ctx: gctx, cancel: cancel, eg: eg, free: append([]holdfast.Locker(nil), lockers...)}, nil
}

// Context returns the Group's context: done after the first error of a
// function passed to Go (its cause is that error), when Wait returns, or
// when the context given to NewGroup is done.
func (g *Group) Context() context.Context { return g.ctx }

// Go calls f in a new goroutine once a permit is granted, and releases the
// permit when f returns.
//
// Go blocks while every locker of the Group is in use by an earlier
// function (waiting for its permit or running), as errgroup.Group.Go does
// after SetLimit; so do not call Go from a function running in the same
// Group. The wait for the permit itself happens in the new goroutine.
//
// f runs under a context derived from the Group's context that is also
// cancelled when the permit ends early: its cause (context.Cause) then
// wraps holdfast.ErrLost, as the permit's does. The backends cancel it
// before the store could give the permit to another client, so f must stop
// its protected work when the context is done. Permit(ctx) returns the
// permit, for its fencing token or its backend's guarded writes.
//
// What f's call counts as, for Wait:
//   - if no permit could be taken (the Group's context ended, the session
//     ended, a limit conflict), f is not called, and the error is Lock's,
//     wrapped; nor is it called if the permit comes after the Group's
//     context ended (the first error cancels it before its function's
//     permit is released, so that permit never runs a waiting function);
//   - if the permit was lost while f ran and f returns an error matching
//     context.Canceled or context.DeadlineExceeded, the error also wraps
//     the loss cause (so errors.Is(err, holdfast.ErrLost) holds);
//   - if the permit was lost while f ran and f returns nil, the error wraps
//     the loss cause: f finished, but not all of it under the permit;
//   - otherwise f's error, unchanged.
//
// The release's own errors are not reported: if the store does not confirm
// it within a few seconds, or the context given to NewGroup ends, the
// session goes on releasing in the background.
func (g *Group) Go(f func(ctx context.Context) error) {
	g.eg.Go(func() error { return g.run(f) })
}

// fail records err as the Group's first error (if it is) and cancels the
// Group's context with it. run calls it before releasing the failed
// function's permit, so a function waiting for that permit finds the
// context done when it is granted, and does not run.
func (g *Group) fail(err error) {
	g.errOnce.Do(func() {
		g.err = err
		g.cancel(err)
	})
}

// Wait blocks until every function passed to Go has returned and its permit
// released (or left to its session's background), then returns the first
// non-nil error (if any) from them, as errgroup.Group.Wait does, and
// cancels the Group's context.
func (g *Group) Wait() error {
	err := g.eg.Wait()
	g.cancel(context.Canceled)
	g.errOnce.Do(func() {}) // no first error after Wait
	if g.err != nil {
		return g.err
	}
	return err
}

// permitKey is the context key under which run stores the permit.
type permitKey struct{}

// Permit returns the permit under which the function that Go called with
// ctx (or a context derived from it) runs, or nil for another context. Its
// Token fences the function's writes; a type switch recovers the backend's
// grant (*etcd.Grant, *consul.Grant) and its guarded writes.
func Permit(ctx context.Context) holdfast.Grant {
	if ctx == nil {
		return nil
	}
	p, _ := ctx.Value(permitKey{}).(holdfast.Grant)
	return p
}

// run is one function's turn: a free locker, a permit, f, the release.
func (g *Group) run(f func(ctx context.Context) error) error {
	// errgroup's limit equals the number of lockers, so one is free.
	l := g.take()
	defer g.put(l)

	p, err := l.Lock(g.ctx)
	if err != nil {
		err = fmt.Errorf("semaphore: wait for a permit: %w", err)
		g.fail(err)
		return err
	}
	// Released once f has returned, after its context is cancelled.
	defer func() {
		uctx, ucancel := context.WithTimeout(g.parent, unlockTimeout)
		_ = p.Unlock(uctx)
		ucancel()
	}()
	if g.ctx.Err() != nil {
		// Granted as the Group failed (the failing function's release
		// freed this permit): f must not run.
		return fmt.Errorf("semaphore: wait for a permit: %w", context.Cause(g.ctx))
	}
	ctx, cancel := context.WithCancelCause(context.WithValue(g.ctx, permitKey{}, p))
	defer cancel(context.Canceled)
	stop := context.AfterFunc(p.Context(), func() { cancel(context.Cause(p.Context())) })
	defer stop()
	err = f(ctx)
	// The permit cannot have been released yet: a cause now is a loss.
	if lost := context.Cause(p.Context()); lost != nil {
		switch {
		case err == nil:
			err = fmt.Errorf("semaphore: permit lost before the function returned: %w", lost)
		case errors.Is(err, lost):
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			err = fmt.Errorf("%w: permit lost: %w", err, lost)
		}
	}
	if err != nil {
		g.fail(err) // before the deferred release
	}
	return err
}

func (g *Group) take() holdfast.Locker {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.free[len(g.free)-1]
	g.free = g.free[:len(g.free)-1]
	return l
}

func (g *Group) put(l holdfast.Locker) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.free = append(g.free, l)
}
