package conformance

import (
	"context"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/leader"
)

// GrantRWLocker is a backend's read-write lock: Lock and TryLock write,
// RLock and TryRLock read, all returning the backend's grant type G.
type GrantRWLocker[G holdfast.Grant] interface {
	holdfast.GrantLocker[G]
	RLock(ctx context.Context) (G, error)
	TryRLock(ctx context.Context) (G, error)
	Downgrade(ctx context.Context, w G) (G, error)
}

// AsRWLocker adapts a backend's read-write lock (such as *etcd.RWMutex) to
// the RWLocker the suite drives, as holdfast.AsLocker does for locks.
func AsRWLocker[G holdfast.Grant](l GrantRWLocker[G]) RWLocker { return rwLocker[G]{l} }

type rwLocker[G holdfast.Grant] struct{ l GrantRWLocker[G] }

func (a rwLocker[G]) Lock(ctx context.Context) (holdfast.Grant, error) { return grant(a.l.Lock(ctx)) }
func (a rwLocker[G]) TryLock(ctx context.Context) (holdfast.Grant, error) {
	return grant(a.l.TryLock(ctx))
}
func (a rwLocker[G]) RLock(ctx context.Context) (holdfast.Grant, error) { return grant(a.l.RLock(ctx)) }
func (a rwLocker[G]) TryRLock(ctx context.Context) (holdfast.Grant, error) {
	return grant(a.l.TryRLock(ctx))
}

// Downgrade passes a grant of another type on as G's zero value, which
// the backend refuses as not its write grant.
func (a rwLocker[G]) Downgrade(ctx context.Context, w holdfast.Grant) (holdfast.Grant, error) {
	g, _ := w.(G)
	return grant(a.l.Downgrade(ctx, g))
}

// AsCandidate adapts a backend's election (such as *etcd.Election, a
// leader.Candidate[*etcd.Grant]) to the leader.Candidate[holdfast.Grant]
// the suite drives.
func AsCandidate[G holdfast.Grant](c leader.Candidate[G]) leader.Candidate[holdfast.Grant] {
	return candidate[G]{c}
}

type candidate[G holdfast.Grant] struct{ c leader.Candidate[G] }

func (a candidate[G]) Name() string { return a.c.Name() }
func (a candidate[G]) Campaign(ctx context.Context, value []byte) (holdfast.Grant, error) {
	return grant(a.c.Campaign(ctx, value))
}
func (a candidate[G]) Leader(ctx context.Context) (holdfast.Leader, error) { return a.c.Leader(ctx) }
func (a candidate[G]) Observe(ctx context.Context) <-chan holdfast.Leader  { return a.c.Observe(ctx) }

// grant converts a backend's (G, error) into (holdfast.Grant, error)
// without turning a nil *T into a non-nil interface.
func grant[G holdfast.Grant](g G, err error) (holdfast.Grant, error) {
	if err != nil {
		return nil, err
	}
	return g, nil
}
