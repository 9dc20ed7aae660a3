package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
)

// Grant is the bookkeeping shared by every backend's grant: key, token, a
// context cancelled on release or loss, the reentrancy count, and the end of
// the grant in the store, which runs in the session's background.
//
// A grant ends once, by Unlock or by loss. Either way its context is
// cancelled first, then the backend's release runs as a background task of
// the session (retried on transport errors while the session lives), and
// only then is done called (it frees the in-process name, so that the same
// session cannot lock the name again before the store has seen the end of
// this grant).
type Grant struct {
	key    string
	token  holdfast.Token
	keeper *Keeper
	bg     *Background
	ctx    *grantContext
	cancel context.CancelCauseFunc
	rel    Releaser
	done   func()

	mu       sync.Mutex
	count    int  // reentrant holds; 0 once released or lost
	ending   bool // the store release has been started
	finished chan struct{}
	result   error // of the store release, once finished is closed
	// unanswered is the error of Unlock's first release attempt when the
	// session retries it: that attempt may have applied.
	unanswered error

	// Observation (see Observed): the name reported, when the grant was
	// handed out, and whether its end was reported.
	name     string
	granted  time.Time
	reported bool
}

// Releaser is a backend's end of a grant in the store.
type Releaser interface {
	// Release removes the grant from the store in one attempt, guarded so
	// that it never touches a newer grant. It returns an error wrapping
	// holdfast.ErrNotHeld when the guard fails (the grant was lost from
	// outside), and a transport error when it may be retried.
	Release(ctx context.Context) error
}

// ReleaseFunc is a Releaser written as a function.
type ReleaseFunc func(ctx context.Context) error

// Release implements Releaser.
func (f ReleaseFunc) Release(ctx context.Context) error { return f(ctx) }

// NewGrant returns a held grant of the session that keeper and bg belong
// to, ended in the store by rel. Its context is a child of the session's.
// done (may be nil) runs once, after the release is over or abandoned
// because the session ended.
func NewGrant(keeper *Keeper, bg *Background, key string, token holdfast.Token, rel Releaser, done func()) *Grant {
	g := &Grant{
		key: key, token: token, keeper: keeper, bg: bg,
		rel: rel, done: done, count: 1,
		finished: make(chan struct{}),
	}
	inner, cancel := context.WithCancelCause(keeper.Context())
	g.ctx, g.cancel = &grantContext{Context: inner, keeper: keeper}, cancel
	context.AfterFunc(inner, g.lost)
	return g
}

// grantContext is a grant's context: its Err and Done check the session's
// safe deadline synchronously (see Keeper.Check), so that a process resumed
// after a pause past the deadline never sees the grant as held, even before
// the deadline's timer has fired.
type grantContext struct {
	context.Context
	keeper *Keeper
}

func (c *grantContext) Err() error {
	_ = c.keeper.Check()
	return c.Context.Err()
}

func (c *grantContext) Done() <-chan struct{} {
	_ = c.keeper.Check()
	return c.Context.Done()
}

// Key implements holdfast.Grant.
func (g *Grant) Key() string { return g.key }

// Token implements holdfast.Grant.
func (g *Grant) Token() holdfast.Token { return g.token }

// Context implements holdfast.Grant.
func (g *Grant) Context() context.Context { return g.ctx }

// Deadline implements holdfast.Grant.
func (g *Grant) Deadline() time.Time { return g.keeper.Deadline() }

// Lose ends the grant with cause (which should wrap holdfast.ErrLost),
// unless it has already ended: a loss seen through our own release (a
// watch, a failed guard) never turns a release into a loss.
func (g *Grant) Lose(cause error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.count > 0 {
		g.cancel(cause)
	}
}

// Held reports whether the grant has neither been released nor lost,
// checking the session's deadline now.
func (g *Grant) Held() bool {
	if g.ctx.Err() != nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.count > 0
}

// NotHeld is the error of an operation on a grant that is not held: it
// wraps holdfast.ErrNotHeld and, if the grant was lost, the cause.
func (g *Grant) NotHeld() error {
	if cause := context.Cause(g.ctx); cause != nil && !errors.Is(cause, holdfast.ErrReleased) {
		return fmt.Errorf("%w: %s: %w", holdfast.ErrNotHeld, g.key, cause)
	}
	return fmt.Errorf("%w: %s was released", holdfast.ErrNotHeld, g.key)
}

// reenter adds a reentrant hold if the grant is still held.
func (g *Grant) reenter() bool {
	if g.ctx.Err() != nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.count == 0 {
		return false
	}
	g.count++
	return true
}

// Observed reports the grant to the session's observers as a grant of name
// whose acquisition began at since; its end is reported too. A grant is
// reported once: a reentrant acquisition that returns it again is not.
func (g *Grant) Observed(name string, since time.Time) {
	if len(g.keeper.observers) == 0 {
		return
	}
	g.mu.Lock()
	if g.name != "" {
		g.mu.Unlock()
		return
	}
	g.name, g.granted = name, time.Now()
	g.mu.Unlock()
	for _, o := range g.keeper.observers {
		o.Acquired(name, g.token, g.granted.Sub(since))
	}
	if g.ctx.Context.Err() != nil { // ended before it was observed
		g.reportEnd()
	}
}

// errClosed is the cause observers get for a grant ended by its session's
// Close (its context's cause still wraps holdfast.ErrLost).
var errClosed = fmt.Errorf("%w: %w", holdfast.ErrReleased, holdfast.ErrSessionClosed)

// reportEnd reports the grant's end to the observers, once, if it was
// observed.
func (g *Grant) reportEnd() {
	g.mu.Lock()
	name, granted, done := g.name, g.granted, g.reported
	g.reported = name != ""
	g.mu.Unlock()
	if name == "" || done {
		return
	}
	cause := context.Cause(g.ctx.Context)
	if errors.Is(cause, holdfast.ErrSessionClosed) {
		// Close ended the grant: the owner's act, as Unlock is, not a loss.
		cause = errClosed
	}
	for _, o := range g.keeper.observers {
		o.Ended(name, g.token, time.Since(granted), cause)
	}
}

// lost runs when the grant's context is cancelled. If that was a loss (not
// Unlock), the grant ends: its leftovers are cleaned up in the background.
func (g *Grant) lost() {
	g.reportEnd()
	g.mu.Lock()
	g.count = 0
	if g.ending { // Unlock ended it
		g.mu.Unlock()
		return
	}
	g.ending = true
	g.mu.Unlock()
	g.background()
}

// background runs the rest of the grant's end as a task of the session (see
// finish), or completes it at once if the session has ended.
func (g *Grant) background() {
	if !g.bg.Go(g.finish) {
		g.result = g.keeper.Err()
		g.complete()
	}
}

// finish is the background task that releases the grant in the store. A
// released grant's key is removed, retrying transport errors while the
// session lives; a lost grant's key is removed if it is still ours, once:
// after a loss the key is usually gone already. If the session ends first,
// the store frees the key with it.
func (g *Grant) finish(ctx context.Context) {
	defer g.complete()
	if errors.Is(context.Cause(g.ctx), holdfast.ErrReleased) {
		g.result = Retry(ctx, g.rel.Release)
		return
	}
	if ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, AttemptTimeout)
		_ = g.rel.Release(actx)
		cancel()
	}
}

func (g *Grant) complete() {
	if g.done != nil {
		g.done()
	}
	close(g.finished)
}

// Unlock implements holdfast.Grant. The first release attempt runs in the
// caller's goroutine, bounded by ctx (a handoff then costs no goroutine
// switch); if it fails on a transport error or ctx, the session retries in
// the background while Unlock waits for ctx.
func (g *Grant) Unlock(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if g.ctx.Err() != nil { // checks the session's deadline now
		return g.NotHeld()
	}
	g.mu.Lock()
	switch {
	case g.count == 0:
		g.mu.Unlock()
		return g.NotHeld()
	case g.count > 1:
		g.count--
		g.mu.Unlock()
		return nil
	}
	g.count, g.ending = 0, true
	g.cancel(holdfast.ErrReleased)
	g.mu.Unlock()
	if err := g.keeper.Err(); err != nil {
		g.result = err
		g.complete()
	} else {
		actx, cancel := context.WithTimeout(ctx, AttemptTimeout)
		err := g.rel.Release(actx)
		cancel()
		if err == nil || Final(err) {
			g.result = err
			g.complete()
		} else {
			g.unanswered = err
			g.background()
			if err := g.await(ctx); err != nil {
				return err
			}
		}
	}
	switch err := g.result; {
	case err == nil:
		return nil
	case errors.Is(err, holdfast.ErrNotHeld) && g.unanswered != nil:
		// Our first attempt may have removed the key without its answer
		// reaching us: no request can tell that from a removal from outside.
		return fmt.Errorf("%w: %s was gone when its release was sent again: the first attempt (%v) may have removed it with its answer lost, or it was removed or taken over from outside: %w", holdfast.ErrNotHeld, g.key, g.unanswered, err)
	case errors.Is(err, holdfast.ErrNotHeld):
		// The guard failed although nothing had told us of a loss: the key
		// was removed or taken over from outside.
		return fmt.Errorf("%w: %s was removed or taken over from outside before Unlock: %w", holdfast.ErrNotHeld, g.key, err)
	default:
		return fmt.Errorf("holdfast: unlock %s: %w", g.key, err)
	}
}

// await waits for the answer of the release that goes on in the
// background. A ctx that ended first gets ctx's error, even if the answer
// came just after (an Unlock with a cancelled ctx always says so).
func (g *Grant) await(ctx context.Context) error {
	if ctx.Err() == nil {
		select {
		case <-g.finished:
			return nil
		case <-ctx.Done():
		}
	}
	return fmt.Errorf("holdfast: unlock %s: release not confirmed, it goes on in the background while the session lives: %w", g.key, ctx.Err())
}

// Handover ends a held grant as Unlock would (its context is cancelled with
// holdfast.ErrReleased), but runs neither the release nor done: the caller
// takes the grant's key in the store and its name slot over (etcd's
// read-write lock turns a write grant into a read grant this way). It
// returns false, changing nothing, if the grant is not held or is held more
// than once (reentrantly).
func (g *Grant) Handover() bool {
	if g.ctx.Err() != nil { // checks the session's deadline now
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.count != 1 || g.ending {
		return false
	}
	g.count, g.ending = 0, true
	g.cancel(holdfast.ErrReleased)
	close(g.finished)
	return true
}

// Finished is closed when the grant's end in the store is over (or was
// abandoned because the session ended).
func (g *Grant) Finished() <-chan struct{} { return g.finished }
