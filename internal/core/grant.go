package core

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/holdfast/holdfast"
)

// Grant is the bookkeeping shared by every backend's grant: key, token, a
// context cancelled on release or loss, reentrancy count, and a guarded
// release supplied by the backend. It implements holdfast.Grant.
type Grant struct {
	key    string
	token  holdfast.Token
	ctx    context.Context
	cancel context.CancelCauseFunc

	// release removes the grant from the store, guarded so that it never
	// touches a newer grant; it returns an error wrapping ErrNotHeld when the
	// guard fails. done frees local resources (the in-process name slot); it
	// runs once, on release or loss.
	release func(context.Context) error
	done    func()
	endOnce sync.Once

	mu    sync.Mutex
	count int // reentrant holds; 0 once released
}

// NewGrant returns a held grant whose context is a child of parent (the
// session's context, so that a lost session cancels every grant with its
// cause). done may be nil.
func NewGrant(parent context.Context, key string, token holdfast.Token, release func(context.Context) error, done func()) *Grant {
	g := &Grant{key: key, token: token, release: release, done: done, count: 1}
	g.ctx, g.cancel = context.WithCancelCause(parent)
	context.AfterFunc(g.ctx, g.end)
	return g
}

func (g *Grant) end() {
	g.endOnce.Do(func() {
		if g.done != nil {
			g.done()
		}
	})
}

// Key implements holdfast.Grant.
func (g *Grant) Key() string { return g.key }

// Token implements holdfast.Grant.
func (g *Grant) Token() holdfast.Token { return g.token }

// Context implements holdfast.Grant.
func (g *Grant) Context() context.Context { return g.ctx }

// Lose cancels the grant with cause (which should wrap holdfast.ErrLost),
// unless it has been released: an Unlock in progress finishes first, so a
// loss seen through our own release (a watch, a failed guard) never turns a
// release into a loss.
func (g *Grant) Lose(cause error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.count > 0 {
		g.cancel(cause)
	}
}

// Reenter adds a reentrant hold if the grant is still held.
func (g *Grant) Reenter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.count == 0 || g.ctx.Err() != nil {
		return false
	}
	g.count++
	return true
}

// Held reports whether the grant has neither been released nor lost.
func (g *Grant) Held() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.count > 0 && g.ctx.Err() == nil
}

// Unlock implements holdfast.Grant. A transport error leaves the grant held
// so that Unlock can be retried; the guarded release makes retries safe.
func (g *Grant) Unlock(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.count == 0 {
		if cause := context.Cause(g.ctx); !errors.Is(cause, holdfast.ErrReleased) {
			return fmt.Errorf("%w: %s: %w", holdfast.ErrNotHeld, g.key, cause)
		}
		return fmt.Errorf("%w: %s already released", holdfast.ErrNotHeld, g.key)
	}
	lost := g.ctx.Err() != nil
	if g.count > 1 && !lost {
		g.count--
		return nil
	}
	// The last hold, or a lost grant (whatever its count): remove our key.
	// After a loss this is best-effort cleanup of a key that may linger.
	err := g.release(ctx)
	if err != nil && !lost && !errors.Is(err, holdfast.ErrNotHeld) {
		return fmt.Errorf("holdfast: unlock %s: %w", g.key, err)
	}
	g.count = 0
	defer g.end()
	switch {
	case lost:
		return fmt.Errorf("%w: %s: %w", holdfast.ErrNotHeld, g.key, context.Cause(g.ctx))
	case err != nil:
		// The guard failed although nothing told us of a loss: the key was
		// removed or taken over from outside. Report it as a loss.
		g.cancel(fmt.Errorf("%w: %s removed from outside", holdfast.ErrLost, g.key))
		return err
	}
	g.cancel(holdfast.ErrReleased)
	return nil
}
