package consul

import (
	"context"
	"fmt"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

// Semaphore is a distributed counting semaphore on Consul: at most limit
// sessions hold a permit at once, first come, first served among holdfast
// contenders, one permit per session per name. It shares its permits with
// api.Semaphore and `consul lock -n N <name> cmd`. A permit's token is the
// ModifyIndex of the write that admitted it (shared by the permits one write
// admits). Another limit, or another kind of lock on the name, is an error
// wrapping holdfast.ErrConflict.
type Semaphore struct {
	p       *permits
	reentry core.Reentry[*Grant]
}

var _ holdfast.GrantLocker[*Grant] = (*Semaphore)(nil)

// NewSemaphore returns the semaphore called name (api.Semaphore's prefix),
// used through session s, without a request. The name follows
// holdfast.ValidateName; limit < 1 is holdfast.ErrInvalidArgument.
// holdfast.WithReentrant makes a Lock that holds a permit return it again.
func NewSemaphore(s *Session, name string, limit int, opts ...holdfast.LockOption) (*Semaphore, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: semaphore limit %d; it must be at least 1", holdfast.ErrInvalidArgument, limit)
	}
	p, err := newPermits(s, name, limit)
	if err != nil {
		return nil, err
	}
	return &Semaphore{p: p, reentry: core.Reentry[*Grant]{Enabled: options.ApplyLock(opts).Reentrant}}, nil
}

// Lock waits for a permit until ctx is done or the session ends; its errors
// and cleanup are Mutex.Lock's.
func (m *Semaphore) Lock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, false, false, &m.reentry)
}

// TryLock takes a permit only if one is free and no holdfast contender
// waits (a read, then a transaction); otherwise it returns an error wrapping
// holdfast.ErrLocked, having written nothing.
func (m *Semaphore) TryLock(ctx context.Context) (*Grant, error) {
	return m.p.acquire(ctx, false, true, &m.reentry)
}
