package etcd

import (
	"context"
	"fmt"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

// Mutex is a distributed, FIFO, fenced lock on etcd. Its keys are those of
// concurrency.Mutex: "<name>/<lease ID in hex>", attached to the session's
// lease; the holder is the key with the lowest create revision. Their value
// is "holdfast lock" (concurrency.Mutex writes an empty one), which tells
// Inspect who wrote them; a join that finds its key with another value (a
// key of our lease written before) puts it again.
//
// A lock's name may not be a prefix of another's at a "/": while the lock
// "a/b" has keys (a holder or waiters), Lock and TryLock of "a" fail with an
// error wrapping holdfast.ErrConflict, as they do on Consul; "a/b" itself is
// unaffected.
//
// A Mutex belongs to one Session. Lock and TryLock may be called from many
// goroutines: through one Session, acquisitions of the same name take turns
// in-process, since they share one key.
type Mutex struct {
	name    string
	q       queue
	reentry core.Reentry[*Grant]
}

var _ holdfast.GrantLocker[*Grant] = (*Mutex)(nil)

// NewMutex returns the lock called name, taken through session s. The name
// follows holdfast.ValidateName; the lock's keys are under "<name>/".
func NewMutex(s *Session, name string, opts ...holdfast.LockOption) (*Mutex, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, err
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	cfg := options.ApplyLock(opts)
	q := newQueue(s, name+"/")
	q.value = mutexValue
	return &Mutex{
		name:    name,
		q:       q,
		reentry: core.Reentry[*Grant]{Enabled: cfg.Reentrant},
	}, nil
}

// Lock waits until the lock is granted (in order of arrival), ctx ends, or
// the session ends, and returns within milliseconds of either, even if etcd
// cannot be reached. On error, what the attempt left in etcd (its waiting
// key) is removed by the session in the background, retried while the
// session lives; until then the name cannot be locked again through this
// session.
func (m *Mutex) Lock(ctx context.Context) (*Grant, error) {
	return acquire(ctx, m.q, m.name, false, &m.reentry, m.q.waitTurn)
}

// TryLock takes the lock only if no key exists under the name (no holder, no
// waiter), in one request, and returns an error wrapping holdfast.ErrLocked
// otherwise. It writes nothing when it fails (after a transport error, what
// the request may have written is removed as after a failed Lock).
func (m *Mutex) TryLock(ctx context.Context) (*Grant, error) {
	return acquire(ctx, m.q, m.name, true, &m.reentry, m.q.tryTurn)
}
