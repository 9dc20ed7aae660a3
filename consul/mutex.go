package consul

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

// A name's lock key (`consul lock <name>`'s) and queue prefix; how long a
// Lock whose ctx ended still waits for its cleanup.
const (
	lockSuffix   = "/.lock"
	queueInfix   = "/.queue/"
	cleanupGrace = 50 * time.Millisecond
)

// LockKey returns the Consul key of the lock called name: "<name>/.lock".
// An api.Lock on LockOptions{Key: LockKey(name)}, or `consul lock name cmd`,
// excludes holdfast's Mutex on name and the other way round.
func LockKey(name string) string { return name + lockSuffix }

// Mutex is a distributed, fair (FIFO), fenced lock on Consul: the key
// "<name>/.lock", acquired with the session and flagged like api.Lock's, so
// api.Lock and `consul lock` exclude it and the other way round (they do not
// queue). holdfast waiters queue under "<name>/.queue/"; a release wakes one
// (docs/DESIGN.md, "Consul acquire"). A live lock of a longer name under
// "<name>/" is holdfast.ErrConflict (keys no session holds are ignored).
// Acquisitions of a name through one Session take turns.
type Mutex struct {
	s       *Session
	name    string
	reentry core.Reentry[*Grant]
}

// The lock's keys, from (name, session) (docs/DESIGN.md, "Consul acquire").
func (m *Mutex) prefix() string      { return m.name + "/" }
func (m *Mutex) lockKey() string     { return m.name + lockSuffix }
func (m *Mutex) tailKey() string     { return m.name + tailSuffix }
func (m *Mutex) queuePrefix() string { return m.name + queueInfix }
func (m *Mutex) queueKey() string    { return m.name + queueInfix + m.s.id }

var _ holdfast.GrantLocker[*Grant] = (*Mutex)(nil)

// NewMutex returns the lock called name (holdfast.ValidateName), taken
// through session s. Options: holdfast.WithReentrant.
func NewMutex(s *Session, name string, opts ...holdfast.LockOption) (*Mutex, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := cmp.Or(holdfast.ValidateName(name), s.alive()); err != nil {
		return nil, err
	}
	return &Mutex{s: s, name: name, reentry: core.Reentry[*Grant]{Enabled: options.ApplyLock(opts).Reentrant}}, nil
}

// Lock waits until the lock is granted (first come, first served among
// holdfast waiters), ctx is done (it returns within milliseconds then, even
// if Consul cannot be reached), or the session ends. The error then
// matches ctx's, or wraps holdfast.ErrSessionLost or ErrSessionClosed;
// holdfast.ErrConflict if the key is not a lock's or a live lock of a
// longer name lies under "<name>/". What a failed Lock left is removed in
// the session's background; Lock waits for that up to 50 ms after ctx
// ended, and the name is locked again through the session only after it.
func (m *Mutex) Lock(ctx context.Context) (*Grant, error) { return m.lock(ctx, false) }

// TryLock takes the lock only if nobody holds it or waits for it (in
// Consul or through this session), and otherwise returns an error wrapping
// holdfast.ErrLocked at once, having written nothing (unless a write's
// outcome is unknown: then cleaned up as after Lock).
func (m *Mutex) TryLock(ctx context.Context) (*Grant, error) { return m.lock(ctx, true) }

func (m *Mutex) lock(ctx context.Context, try bool) (*Grant, error) {
	return acquire(ctx, m.s, m.name, try, &m.reentry, &acquisition{m: m})
}
