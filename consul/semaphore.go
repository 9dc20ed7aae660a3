package consul

import (
	"context"
	"fmt"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

// Semaphore is a distributed counting semaphore on Consul: at most Limit
// sessions hold a permit at once. It is fair (first come, first served
// among holdfast contenders), fenced, and wire-compatible with api.Semaphore
// and `consul lock -n N <name> cmd`, which share its permits.
//
// Layout (api.Semaphore's, with prefix = name): each contender holds the key
// "<name>/<session ID>", acquired with its session and flagged
// api.SemaphoreFlagValue; the key "<name>/.lock", with the same flags and no
// session, holds {"Limit":N,"Holders":{"<session ID>":true,...}} and is
// updated by CAS on its ModifyIndex. A holder whose session holds no key
// under "<name>/" any more is dead and is pruned by the next write. holdfast
// contender keys have the value "holdfast" while they wait and "holdfast
// held" once admitted (api.Semaphore ignores contender values); a foreign
// contender is one with any other value.
//
// Algorithm. A contender creates its key and reads the subtree in one
// transaction; holdfast waiters queue by the keys' CreateIndex (first come,
// first served). On Unlock, a holdfast holder reads the subtree and, in one
// transaction guarded by a check-session of its own key, CASes the lock key
// to replace itself by the waiters at the head of the queue that then fit
// (one, for a semaphore), CASes each admitted waiter's key to "holdfast
// held" (so its ModifyIndex is the token), and deletes its own key; with
// nobody waiting it only removes itself, and deletes the lock key when no
// holder is left. So a waiter simply watches its own key (one blocking
// query; one wakes per release), and re-reads every 5 s, which prunes dead
// holders. Only the head of the queue acts itself: if it finds room (a
// foreign release, a dead holder, a fresh semaphore), it admits itself and
// the waiters behind it that fit, with the same CASes; and until a write of
// the lock key made after it joined guarantees that every later release
// reads it as the head, it watches the lock key. Foreign contenders
// (api.Semaphore) do not queue and hand nothing over: they take a permit
// when they find room; while one is about, holdfast waiters watch the
// waiter just ahead of them and the head watches the lock key, so nobody
// waits for a foreign contender in a way that could deadlock. A release
// that loses a CAS race reads again after a random pause of a few
// milliseconds. A waiter that gives up passes the baton: with its key's
// deletion it admits the waiters that now fit and writes the lock key (so
// that a release from an older read fails its CAS and reads again). A join
// abandoned on the way that lands after the cleanup is removed by the
// session a little later (see Lock). Measured with limit 4 and no hold
// time (docs/BENCHMARKS.md, the full run): 5.2 HTTP requests per
// acquisition at 8 contenders and 5.4 at 32, every blocking query included,
// against 23 and 53 for api.Semaphore, whose waiters all wake on every
// change (TestSemaphoreVersusAPI fails above 8).
//
// The token of a permit is the ModifyIndex of the lock-key write that
// admitted it (the contender key is written in that same transaction, so
// it has that index). Tokens of successive admitting writes strictly
// increase, but the permits one write admits together (a release that
// frees room for several waiters, a head that admits the waiters behind it
// that fit) share its index: with limit N, up to N permits are valid at
// once, some of them possibly with equal tokens. A fence that accepts a
// token at least the highest it has seen accepts all of them, and refuses
// every permit admitted before them once one of them has written.
//
// Clients that disagree on the limit: Lock and TryLock fail with an error
// wrapping holdfast.ErrLimitMismatch (an ErrConflict) that names both limits (as api.Semaphore's
// "semaphore limit conflict"), and leave nothing behind. A lock key with
// other flags (a Mutex's or api.Lock's, an RWMutex's) or a value that is not
// a semaphore's is an error wrapping holdfast.ErrConflict, and is never
// overwritten; so are keys of a longer name under "<name>/".
//
// One permit per session per name at a time: concurrent Lock calls of one
// Session on the same name take turns in-process, as for Mutex.
type Semaphore struct {
	p       *permits
	reentry core.Reentry[*Grant]
}

var _ holdfast.GrantLocker[*Grant] = (*Semaphore)(nil)

// SemaphoreFlagValue is the flags value of a Semaphore's keys,
// api.SemaphoreFlagValue.
const SemaphoreFlagValue uint64 = api.SemaphoreFlagValue

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
		p:       newPermits(s, "semaphore", name, SemaphoreFlagValue, limit),
		reentry: core.Reentry[*Grant]{Enabled: options.ApplyLock(opts).Reentrant},
	}, nil
}

// Name returns the semaphore's name (api.Semaphore's prefix).
func (m *Semaphore) Name() string { return m.p.name }

// Limit returns the semaphore's limit.
func (m *Semaphore) Limit() int { return m.p.limit }

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
func (m *Semaphore) Lock(ctx context.Context) (*Grant, error) { return m.lock(ctx, false) }

// TryLock takes a permit only if one is free and no holdfast contender
// waits, with one read and one transaction; otherwise it returns an error
// wrapping holdfast.ErrLocked after the read, having written nothing.
func (m *Semaphore) TryLock(ctx context.Context) (*Grant, error) { return m.lock(ctx, true) }

// lock is Lock and TryLock: a reentrant hold if the option allows one,
// after the checks of the arguments and the session (etcd's order).
func (m *Semaphore) lock(ctx context.Context, try bool) (*Grant, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if err := m.p.s.alive(); err != nil {
		return nil, err
	}
	if g, ok := m.reentry.Enter(); ok {
		return g, nil
	}
	g, err := m.p.acquire(ctx, false, try)
	if err == nil {
		m.reentry.Remember(g, g.base)
	}
	return g, err
}

// noReentry refuses holdfast.WithReentrant, which read-write locks do not
// support (on etcd either).
func noReentry(opts []holdfast.LockOption) error {
	if options.ApplyLock(opts).Reentrant {
		return fmt.Errorf("%w: a read-write lock is not reentrant", holdfast.ErrInvalidArgument)
	}
	return nil
}
