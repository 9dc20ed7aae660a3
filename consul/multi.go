package consul

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// MultiMutex locks a set of names as one grant: each name is an ordinary
// Mutex (its keys and FIFO queue), and the names are taken in one canonical
// order (sorted, without duplicates), so multi-name locks never deadlock
// one another.
type MultiMutex struct {
	s     *Session
	names []string
}

// NewMultiMutex returns the lock of names (each holdfast.ValidateName),
// taken through session s; a name under another of the set ("a" and "a/b")
// is an error wrapping holdfast.ErrInvalidArgument.
func NewMultiMutex(s *Session, names ...string) (*MultiMutex, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	sorted, err := core.MultiNames(names)
	if err = cmp.Or(err, s.alive()); err != nil {
		return nil, err
	}
	return &MultiMutex{s: s, names: sorted}, nil
}

// Lock takes every name in canonical order, each waiting in its FIFO
// queue. If ctx or the session ends or a part fails, the names already
// held are released and nothing is left held or queued.
func (m *MultiMutex) Lock(ctx context.Context) (*MultiGrant, error) { return m.lock(ctx, false) }

// TryLock takes every name with Mutex.TryLock, and fails with an error
// wrapping holdfast.ErrLocked at the first one held or waited for,
// releasing those taken before it.
func (m *MultiMutex) TryLock(ctx context.Context) (*MultiGrant, error) { return m.lock(ctx, true) }

func (m *MultiMutex) lock(ctx context.Context, try bool) (*MultiGrant, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	multi, err := core.LockAll(ctx, m.names, func(ctx context.Context, i int) (*Grant, error) {
		return (&Mutex{s: m.s, name: m.names[i]}).lock(ctx, try) // each an ordinary Mutex
	})
	if err != nil {
		return nil, err
	}
	return &MultiGrant{multi: multi}, nil
}

// MultiGrant is a held multi-name lock: one Grant per name, each fencing
// the writes that concern its name; Txn guards a write by every name.
type MultiGrant struct {
	multi *core.Multi[*Grant]
}

// Names returns the names, sorted.
func (g *MultiGrant) Names() []string { return g.multi.Names() }

// Grant returns the grant of name, or nil if name is not one of the set.
func (g *MultiGrant) Grant(name string) *Grant {
	p, _ := g.multi.Part(name)
	return p
}

// Token returns the fencing token of name's grant (0: not one of the set).
func (g *MultiGrant) Token(name string) holdfast.Token { return g.multi.Token(name) }

// Context is cancelled when any part ends: with holdfast.ErrReleased after
// Unlock, else with the first lost part's cause.
func (g *MultiGrant) Context() context.Context { return g.multi.Context() }

// Deadline is the earliest of the parts' safe deadlines.
func (g *MultiGrant) Deadline() time.Time { return g.multi.Deadline() }

// Key returns the key of name's grant ("": not one of the set).
func (g *MultiGrant) Key(name string) string { return g.multi.Key(name) }

// Unlock releases every part concurrently, as Grant.Unlock does, and
// returns their errors joined.
func (g *MultiGrant) Unlock(ctx context.Context) error { return g.multi.Unlock(ctx) }

// Txn runs ops in one transaction that applies only while every part is
// held (a check-session of each lock key first), else the error wraps
// holdfast.ErrNotHeld and the multi-grant ends. ops follow Grant.Txn's
// rules, with at most MaxTxnOps minus the number of names; on success the
// Results are those of ops.
func (g *MultiGrant) Txn(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	parts := g.multi.Parts()
	s := parts[0].s
	if len(ops)+len(parts) > MaxTxnOps {
		return nil, fmt.Errorf("%w: %d operations and %d guards: more than %d", holdfast.ErrInvalidArgument, len(ops), len(parts), MaxTxnOps)
	}
	guard := make(api.TxnOps, 0, len(parts))
	for i, p := range parts {
		if err := p.checkOps(ops); err != nil {
			return nil, err
		}
		guard = append(guard, multiPartGuard(p, i == len(parts)-1)...)
	}
	if !g.multi.Held() {
		return nil, g.multi.NotHeld()
	}
	return s.guardedTxn(ctx, g.multi, fmt.Sprint("a lock key of ", g.multi.Names()), "session "+s.id, guard, ops)
}
