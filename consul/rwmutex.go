package consul

import (
	"context"
	"fmt"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

// RWMutex is a distributed, fair (FIFO), fenced read-write lock on Consul:
// readers share it, a writer excludes everyone, and a reader queued behind
// a writer waits. Its keys are Semaphore's layout with RWMutexFlagValue;
// another kind of lock on its name is an error wrapping
// holdfast.ErrConflict. Tokens are as Semaphore's: a fence refuses a stale
// writer, and a stale reader after a newer writer. One grant per session
// per name at a time.
type RWMutex struct {
	p *permits
}

var _ holdfast.GrantLocker[*Grant] = (*RWMutex)(nil)

// NewRWMutex returns the read-write lock called name, used through session
// s, without a request; holdfast.WithReentrant is ErrInvalidArgument.
func NewRWMutex(s *Session, name string, opts ...holdfast.LockOption) (*RWMutex, error) {
	if options.ApplyLock(opts).Reentrant {
		return nil, fmt.Errorf("%w: a read-write lock is not reentrant", holdfast.ErrInvalidArgument)
	}
	p, err := newPermits(s, name, 0)
	if err != nil {
		return nil, err
	}
	return &RWMutex{p: p}, nil
}

// Lock waits for the write lock (see Semaphore.Lock).
func (m *RWMutex) Lock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, true, false, nil)
}

// TryLock takes the write lock only if nobody holds it or waits; otherwise
// it returns an error wrapping holdfast.ErrLocked, having written nothing.
func (m *RWMutex) TryLock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, true, true, nil)
}

// RLock waits for a read lock: at once if only readers hold the lock and
// nobody waits; behind every contender queued before it otherwise.
func (m *RWMutex) RLock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, false, false, nil)
}

// TryRLock takes a read lock only if no writer holds the lock and nobody
// waits; otherwise it returns an error wrapping holdfast.ErrLocked.
func (m *RWMutex) TryRLock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, false, true, nil)
}

// Downgrade turns w, a write grant of this RWMutex, into a read grant with
// w's key and token, in one guarded transaction that also admits the
// readers queued at the head: no writer gets in between. w ends first,
// whatever happens next. If w was lost, the error wraps holdfast.ErrNotHeld;
// if the outcome is unknown, the session releases the lock in the
// background. If w is not a write grant of m: holdfast.ErrInvalidArgument.
func (m *RWMutex) Downgrade(ctx context.Context, w *Grant) (*Grant, error) {
	var a *pacq
	if w != nil {
		a, _ = w.rel.(*pacq)
	}
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	case a == nil || a.p != m.p || !a.exclusive:
		return nil, fmt.Errorf("%w: not a write grant of %s", holdfast.ErrInvalidArgument, m.p.name)
	case !w.base.Handover(): // w ends; the read grant takes its key and name slot over
		return nil, w.base.NotHeld()
	}
	p, s := m.p, m.p.s
	s.forget(w)
	ctx, cancel := core.Bind(ctx, s.keeper.Context())
	defer cancel()
	ctx, stop := context.WithTimeout(ctx, requestTimeout)
	defer stop()
	if err := p.leave(ctx, leaveDowngrade); err != nil {
		s.cleanUp(p.leftover(), a.free)
		return nil, fmt.Errorf("holdfast/consul: downgrade %s: %w", p.name, err)
	}
	g, err := (&pacq{p: p}).grant(uint64(w.Token()), a.free)
	if err != nil {
		return nil, err
	}
	g.base.Observed(p.name, time.Now())
	return g, nil
}
