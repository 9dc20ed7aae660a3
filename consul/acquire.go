package consul

import (
	"context"
	"fmt"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// joiner is the store half of one acquisition: a waiting algorithm, with
// TryLock's one-shot variant, what a failed one left, and its grant.
type joiner interface {
	// join runs the algorithm (TryLock's if try) and returns the token.
	join(ctx context.Context, try bool) (uint64, error)
	// cleanup returns the cleanup of what a failed join may have left in
	// Consul; ok false: nothing; uncertain: a write got no answer and may
	// land after the cleanup (see Session.sweepLater).
	cleanup() (l leftover, ok, uncertain bool)
	// grant turns the token into a Grant that frees the name slot (free)
	// once it has ended.
	grant(token uint64, free func()) (*Grant, error)
}

// acquire is the driver of every acquisition on Consul (Mutex, Election,
// Semaphore, RWMutex): it runs j in the session's slot of name and turns its
// answer into a Grant or an error. A nil reentry means the primitive is not reentrant. The steps
// are in docs/DESIGN.md ("Consul acquisition driver").
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
	wctx, cancel := s.bind(ctx) // 2. every wait ends with the session
	defer cancel()
	free, err := s.slot(wctx, name, try) // 3. the session's slot of the name
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

// The Mutex's and the Election's acquisition (queue.go: join) is a joiner.

func (a *acquisition) cleanup() (leftover, bool, bool) {
	return leftover{name: a.m.name, m: a.m}, a.left, a.uncertain
}

func (a *acquisition) grant(token uint64, free func()) (*Grant, error) {
	return a.m.grant(token, a, free)
}

// slot takes the session's slot of name (TryLock: only if it is free, else
// an error wrapping holdfast.ErrLocked) and returns the function that
// frees it.
func (s *Session) slot(ctx context.Context, name string, try bool) (func(), error) {
	if !try {
		return s.names.Acquire(ctx, name)
	}
	if free, ok := s.names.TryAcquire(name); ok {
		return free, nil
	}
	return nil, fmt.Errorf("%w: %s is being taken through this session", holdfast.ErrLocked, name)
}

// settle removes what a failed join of j left, in the session's background,
// then frees the slot; it waits for that up to cleanupGrace after ctx
// ended (Consul usually answers within a millisecond).
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
	grace := time.NewTimer(cleanupGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		select {
		case <-done:
		case <-grace.C:
		}
	}
}

// sweepDelays are when, after a failed acquisition whose write had an
// unknown outcome, the session looks again for what it left (see
// Session.sweepLater).
var sweepDelays = []time.Duration{250 * time.Millisecond, time.Second, 3 * time.Second, 10 * time.Second}

// failed is the error of a failed acquisition: the session's cause if the
// session ended, else the caller's context error if it ended the call (ctx
// is the caller's, wctx the one the acquisition ran under, which ends with
// ctx or the session), else err (etcd's order).
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
