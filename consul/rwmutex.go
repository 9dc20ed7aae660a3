package consul

import (
	"context"
	"fmt"
	"time"

	"github.com/holdfast/holdfast"
)

// RWMutex is a distributed, fair (FIFO), fenced read-write lock on Consul:
// any number of readers share it, a writer excludes everyone. Waiters are
// admitted in the order they queued (the readers at the head together): a
// reader behind a queued writer waits, so writers do not starve.
//
// Consul has no native read-write lock: its keys are Semaphore's layout
// with values and flags of its own (RWMutexFlagValue; see docs/DESIGN.md).
// A Mutex, api.Lock, a Semaphore or api.Semaphore on the same name, and an
// RWMutex on theirs, fails with an error wrapping holdfast.ErrConflict and
// leaves nothing behind.
//
// A grant's token is the ModifyIndex of the lock-key write that admitted it
// (a read grant made by Downgrade keeps the write grant's). A fence that
// refuses tokens lower than the highest it has seen refuses a stale writer
// after a newer reader or writer got in, and a stale reader after a newer
// writer got in (readers share: among them, order does not matter).
//
// One grant per session per name at a time: Lock and RLock calls of one
// Session on the same name take turns in-process.
type RWMutex struct {
	p *permits
}

var _ holdfast.GrantLocker[*Grant] = (*RWMutex)(nil)

// NewRWMutex returns the read-write lock called name, used through session
// s. The name follows holdfast.ValidateName. No request is made.
// holdfast.WithReentrant is refused with holdfast.ErrInvalidArgument.
func NewRWMutex(s *Session, name string, opts ...holdfast.LockOption) (*RWMutex, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, err
	}
	if err := noReentry(opts); err != nil {
		return nil, err
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	return &RWMutex{p: newPermits(s, name, 0)}, nil
}

// Lock waits for the write lock (see Semaphore.Lock for errors, ctx and
// cleanup).
func (m *RWMutex) Lock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, true, false, nil)
}

// TryLock takes the write lock only if nobody holds the lock or waits for
// it; otherwise it returns an error wrapping holdfast.ErrLocked, having
// written nothing.
func (m *RWMutex) TryLock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, true, true, nil)
}

// RLock waits for a read lock: at once if only readers hold the lock and
// nobody waits; behind every contender queued before it otherwise.
func (m *RWMutex) RLock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, false, false, nil)
}

// TryRLock takes a read lock only if no writer holds the lock and nobody
// waits; otherwise it returns an error wrapping holdfast.ErrLocked, having
// written nothing.
func (m *RWMutex) TryRLock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, false, true, nil)
}

// Downgrade turns w, a write grant of this RWMutex, into a read grant with
// w's key and token, without a moment when another writer could get in: one
// transaction, guarded by our session holding our key and by CAS on the
// lock key, makes us a reader and admits the readers queued at the head.
// As on etcd, w ends (its context is cancelled with holdfast.ErrReleased)
// before the transaction is sent, and whatever happens next. If Consul
// refused it because w was lost, the error wraps holdfast.ErrNotHeld; if its
// outcome is unknown (ctx ended, Consul unreachable), the session releases
// the lock in the background, as after a failed Lock. If w is not a write
// grant of this RWMutex, the error wraps holdfast.ErrInvalidArgument.
func (m *RWMutex) Downgrade(ctx context.Context, w *Grant) (*Grant, error) {
	var h *permitHold
	if w != nil {
		h, _ = w.rel.(*permitHold)
	}
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	case h == nil || h.p != m.p || !h.exclusive:
		return nil, fmt.Errorf("%w: not a write grant of %s", holdfast.ErrInvalidArgument, m.p.name)
	}
	p, s := m.p, m.p.s
	// End w without releasing its key; the read grant takes the key and
	// the session's slot of the name over.
	if !w.base.Handover() {
		return nil, w.base.NotHeld()
	}
	s.forget(w)
	free := h.free
	ctx, cancel := s.bind(ctx)
	defer cancel()
	ctx, stop := context.WithTimeout(ctx, requestTimeout)
	defer stop()
	if _, err := p.leave(ctx, leaveDowngrade); err != nil {
		s.cleanUp(p.leftover(), free)
		return nil, fmt.Errorf("holdfast/consul: downgrade %s: %w", p.name, err)
	}
	g, err := p.grant(uint64(w.Token()), false, free)
	if err != nil {
		return nil, err
	}
	g.base.Observed(p.name, time.Now())
	return g, nil
}
