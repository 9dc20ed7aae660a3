package consul

import (
	"context"
	"fmt"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

// Semaphore is a distributed counting semaphore on Consul: at most Limit
// sessions hold a permit at once. It is fair (first come, first served
// among holdfast contenders), fenced, and wire-compatible with api.Semaphore
// and `consul lock -n N <name> cmd`, which share its permits: contender keys
// "<name>/<session ID>" acquired with the session, and "<name>/.lock"
// holding {"Limit":N,"Holders":{...}} (see docs/DESIGN.md for the
// algorithm).
//
// A permit's token is the ModifyIndex of the lock-key write that admitted
// it. Tokens of successive admissions strictly increase, but permits
// admitted by one write share its index: a fence that accepts tokens at
// least the highest it has seen accepts them all.
//
// Clients that disagree on the limit fail with an error wrapping
// holdfast.ErrConflict that names both limits, and leave nothing behind; so
// does a lock key of another kind, or keys of a longer name under
// "<name>/". One permit per session per name at a time: concurrent Lock
// calls of one Session on the same name take turns in-process.
type Semaphore struct {
	p       *permits
	reentry core.Reentry[*Grant]
}

var _ holdfast.GrantLocker[*Grant] = (*Semaphore)(nil)

// NewSemaphore returns the semaphore called name (api.Semaphore's prefix)
// with the given limit, used through session s. The name follows
// holdfast.ValidateName; limit < 1 is an error wrapping
// holdfast.ErrInvalidArgument. No request is made. Options:
// holdfast.WithReentrant (a Lock through a Semaphore that holds a permit
// returns that permit again, as for Mutex).
func NewSemaphore(s *Session, name string, limit int, opts ...holdfast.LockOption) (*Semaphore, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("%w: semaphore limit %d; it must be at least 1", holdfast.ErrInvalidArgument, limit)
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	return &Semaphore{
		p:       newPermits(s, name, limit),
		reentry: core.Reentry[*Grant]{Enabled: options.ApplyLock(opts).Reentrant},
	}, nil
}

// Lock waits for a permit (first come, first served among holdfast
// contenders), until ctx is done or the session ends, and returns it. Its
// errors and cleanup are as for Mutex.Lock: within milliseconds of ctx
// ending, even if Consul cannot be reached; what the call left (our
// contender key, our place among the holders if a handoff reached us as we
// gave up) is removed by the session in the background, and Lock waits up to
// 50 ms after ctx ended for that. If a join or admission request had an
// unknown outcome, the session looks again 0.25, 1.25, 4.25 and 14.25 s
// later (while no call of its own uses the name) and removes a request of
// ours that landed late. An error wraps holdfast.ErrConflict if the
// name is not this semaphore's (see Semaphore).
func (m *Semaphore) Lock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, false, false, &m.reentry)
}

// TryLock takes a permit only if one is free and no holdfast contender
// waits, with one read and one transaction; otherwise it returns an error
// wrapping holdfast.ErrLocked after the read, having written nothing.
func (m *Semaphore) TryLock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, false, true, &m.reentry)
}

// noReentry refuses holdfast.WithReentrant, which read-write locks do not
// support (on etcd either).
func noReentry(opts []holdfast.LockOption) error {
	if options.ApplyLock(opts).Reentrant {
		return fmt.Errorf("%w: a read-write lock is not reentrant", holdfast.ErrInvalidArgument)
	}
	return nil
}
