package consul

import (
	"context"
	"fmt"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// RWMutex is a distributed, fair (FIFO), fenced read-write lock on Consul:
// any number of readers share it, a writer excludes everyone.
//
// Consul has no native read-write lock, so this is holdfast's own layout,
// that of Semaphore with another lock value and other flags: contenders hold
// "<name>/<session ID>" (acquired with their session, flagged
// RWMutexFlagValue, valued "holdfast read" or "holdfast write" while they
// wait and "holdfast held" once admitted), and "<name>/.lock" (flagged
// RWMutexFlagValue, no session) holds {"Holders":{"<session ID>":"read"|
// "write"}}, updated by CAS. A Mutex, api.Lock, a Semaphore or api.Semaphore
// on the same name refuses the lock key's flags (or finds contender keys
// that are not its own) with an error, and an RWMutex refuses theirs with
// an error wrapping holdfast.ErrConflict; whoever comes second fails, and
// leaves nothing behind.
//
// Waiters queue by their keys' CreateIndex and are admitted in that order:
// a reader behind a queued writer waits, so writers do not starve; the
// readers at the head of the queue are admitted together. Waiting and
// handoff are as for Semaphore (see it): the head of the queue watches the
// lock key, every other waiter the waiter just ahead of it, and a release
// admits, in the same transaction, the waiters that then fit.
//
// Tokens: a grant's token is the ModifyIndex of the lock-key write that
// admitted it (for a read grant made by Downgrade, of the downgrade's write).
// Those writes are serialized by CAS on the lock key, so write grants'
// tokens strictly increase, and a read grant's token is greater than the
// token of every write grant that ended before it began and smaller than
// that of every write grant that begins after it ends. A fenced resource
// that refuses any operation with a token lower than the highest it has
// seen therefore refuses a stale writer after a newer reader or writer got
// in, and a stale reader after a newer writer got in (readers share: among
// them, order does not matter).
//
// A holder whose session ends stops being counted: the next write prunes
// holders whose session holds no key under "<name>/". Its grant's context is
// cancelled before that can happen when the session ends by its TTL (the
// session's safe deadline), as for every grant of the session.
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
	return &RWMutex{p: newPermits(s, "read-write lock", name, RWMutexFlagValue, 0)}, nil
}

// Name returns the lock's name.
func (m *RWMutex) Name() string { return m.p.name }

// Lock waits for the write lock (see Semaphore.Lock for errors, ctx and
// cleanup).
func (m *RWMutex) Lock(ctx context.Context) (*Grant, error) { return m.p.acquire(ctx, true, false) }

// TryLock takes the write lock only if nobody holds the lock or waits for
// it; otherwise it returns an error wrapping holdfast.ErrLocked, having
// written nothing.
func (m *RWMutex) TryLock(ctx context.Context) (*Grant, error) { return m.p.acquire(ctx, true, true) }

// RLock waits for a read lock: at once if only readers hold the lock and
// nobody waits; behind every contender queued before it otherwise.
func (m *RWMutex) RLock(ctx context.Context) (*Grant, error) { return m.p.acquire(ctx, false, false) }

// TryRLock takes a read lock only if no writer holds the lock and nobody
// waits; otherwise it returns an error wrapping holdfast.ErrLocked, having
// written nothing.
func (m *RWMutex) TryRLock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, false, true)
}

// Downgrade turns the write grant w of this RWMutex into a read grant,
// without releasing: one transaction, guarded by our session holding our
// key and by CAS on the lock key, changes our mode to read and admits the
// readers queued at the head (up to the first queued writer), so no writer
// can get in between. The read grant's token is the index of that write
// (newer than w's). Once the read grant exists, w ends: its context is
// cancelled with holdfast.ErrReleased and its Unlock returns an error
// wrapping holdfast.ErrNotHeld. If w is not held, the error wraps
// holdfast.ErrNotHeld; if w is not a write grant of this RWMutex,
// holdfast.ErrInvalidArgument. If the request fails (a transport error, ctx
// ended), w stays the grant, and the lock may be held for reading or
// writing: Unlock w to release either.
func (m *RWMutex) Downgrade(ctx context.Context, w *Grant) (*Grant, error) {
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	case w == nil || w.permit == nil || w.permit.p != m.p || !w.permit.exclusive:
		return nil, fmt.Errorf("%w: not a write grant of %s", holdfast.ErrInvalidArgument, m.p.name)
	case !w.base.Held():
		return nil, w.base.NotHeld()
	}
	h := w.permit
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	token, err := m.p.leave(ctx, nil, leaveDowngrade)
	if err != nil {
		return nil, fmt.Errorf("holdfast/consul: downgrade %s: %w", m.p.name, err)
	}
	r := &permitHold{p: m.p, free: h.free}
	g := &Grant{s: m.p.s, prefix: m.p.prefix, permit: r}
	g.base = core.NewGrant(m.p.s.keeper, m.p.s.bg, m.p.myKey, holdfast.Token(token), g.releasePermit, r.done)
	h.moved.Store(true)
	m.p.s.hold(g)
	_ = w.base.Unlock(ctx) // its release and done do nothing now
	if g.Context().Err() != nil {
		return nil, m.p.s.alive()
	}
	g.base.Observed(m.p.name, time.Now())
	return g, nil
}
