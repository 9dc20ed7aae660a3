package consul

import (
	"context"
	"fmt"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// joiner is the store half of one acquisition.
type joiner interface {
	// join runs the waiting algorithm (TryLock's if try): the token.
	join(ctx context.Context, try bool) (uint64, error)
	// cleanup is what a failed join may have left (ok false: nothing;
	// uncertain: a write got no answer, see Session.sweepLater).
	cleanup() (l leftover, ok, uncertain bool)
	// grant turns the token into a Grant that calls free once ended.
	grant(token uint64, free func()) (*Grant, error)
}

// acquire is the driver of every acquisition on Consul: it runs j in the
// session's slot of name and turns its answer into a Grant or an error (a
// nil reentry: not reentrant). Steps: docs/DESIGN.md ("Consul acquisition
// driver").
func acquire(ctx context.Context, s *Session, name string, try bool, reentry *core.Reentry[*Grant], j joiner) (*Grant, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	if reentry != nil { // 1. reentry
		if g, ok := reentry.Enter(); ok {
			return g, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("holdfast/consul: lock %s: %w", name, err)
	}
	end, err := s.begin() // Close waits for us
	if err != nil {
		return nil, err
	}
	defer end()
	start := time.Now()
	defer s.keeper.Waiting(name)()
	wctx, cancel := core.Bind(ctx, s.keeper.Context()) // 2. every wait ends with the session
	defer cancel()
	free, err := s.names.Slot(wctx, name, try) // 3. the session's slot of the name
	if err != nil {
		return nil, failed(ctx, wctx, s, name, err)
	}
	token, err := j.join(wctx, try) // 4. the store
	if err != nil {
		s.settle(wctx, j, free) // 5. clean up what the join left
		return nil, failed(ctx, wctx, s, name, err)
	}
	g, err := j.grant(token, free) // 6. the grant
	if err != nil {
		return nil, err
	}
	g.base.Observed(name, start)
	if reentry != nil {
		reentry.Remember(g, g.base)
	}
	return g, nil
}

// The Mutex's and the Election's acquisition is a joiner: something of
// it may be left once it queued or a write got no answer; its grant, a
// child of the session's context, is released through it.

func (a *acquisition) cleanup() (leftover, bool, bool) {
	return leftover{name: a.m.name, clean: a.m.clean}, a.queueIndex != 0 || a.uncertain, a.uncertain
}

func (a *acquisition) grant(token uint64, free func()) (*Grant, error) {
	return a.m.s.grant(a.m.lockKey(), a.m.prefix(), token, a, free)
}

// settle removes what a failed join of j left, in the session's
// background, then frees the slot; it waits for that up to cleanupGrace
// after ctx ended.
func (s *Session) settle(ctx context.Context, j joiner, free func()) {
	l, ok, uncertain := j.cleanup()
	if !ok {
		free()
		return
	}
	done := s.cleanUp(l, free)
	if uncertain {
		s.sweepLater(l)
	}
	select {
	case <-done:
	case <-ctx.Done():
		select {
		case <-done:
		case <-time.After(cleanupGrace):
		}
	}
}

// failed is the error of a failed acquisition (etcd's order): the
// session's end, else the caller's ctx's (ctx; wctx is the one the
// acquisition ran under), else err.
func failed(ctx, wctx context.Context, s *Session, name string, err error) error {
	if wctx.Err() == nil {
		return err
	}
	if serr := s.alive(); serr != nil {
		return serr
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("holdfast/consul: lock %s: %w", name, cerr)
	}
	return err
}
