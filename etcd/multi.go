package etcd

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// MultiMutex locks a set of names as one grant. Each name is an ordinary
// Mutex (same keys, same FIFO queue per name, so it excludes Mutex,
// concurrency.Mutex and etcdctl lock users of that name); the names are
// always taken in one canonical order (sorted, duplicates removed), so
// multi-name locks never deadlock one another, whatever order their callers
// pass the names in.
type MultiMutex struct {
	s     *Session
	names []string
	ms    []*Mutex
}

// NewMultiMutex returns the lock of names, taken through session s. Each
// name follows holdfast.ValidateName; duplicates are ignored; a name under
// another of the set ("a" and "a/b") is an error wrapping
// holdfast.ErrInvalidArgument.
func NewMultiMutex(s *Session, names ...string) (*MultiMutex, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	sorted, err := core.MultiNames(names)
	if err != nil {
		return nil, err
	}
	m := &MultiMutex{s: s, names: sorted}
	for _, n := range sorted {
		mu, err := NewMutex(s, n)
		if err != nil {
			return nil, err
		}
		m.ms = append(m.ms, mu)
	}
	return m, nil
}

// Lock takes every name, one after the other in canonical order, each
// waiting in its name's FIFO queue (holding the names before it). It
// returns when all are held, or with an error when ctx or the session ends
// or a part fails; then the names already held are released and the
// waiting key removed (in the session's background if ctx has ended),
// leaving nothing held or queued.
func (m *MultiMutex) Lock(ctx context.Context) (*MultiGrant, error) { return m.lock(ctx, false) }

// TryLock takes every name with Mutex.TryLock, in canonical order, and
// fails with an error wrapping holdfast.ErrLocked at the first one held or
// waited for; the names taken before it are then released.
func (m *MultiMutex) TryLock(ctx context.Context) (*MultiGrant, error) { return m.lock(ctx, true) }

func (m *MultiMutex) lock(ctx context.Context, try bool) (*MultiGrant, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	multi, err := core.LockAll(ctx, m.names, func(ctx context.Context, i int) (*Grant, error) {
		if try {
			return m.ms[i].TryLock(ctx)
		}
		return m.ms[i].Lock(ctx)
	})
	if err != nil {
		return nil, err
	}
	return &MultiGrant{multi: multi, s: m.s}, nil
}

// MultiGrant is a held multi-name lock: one Grant per name. A write that
// concerns one name is fenced by that name's token (Token(name)); Txn
// guards a write by every name at once.
type MultiGrant struct {
	multi *core.Multi[*Grant]
	s     *Session
}

// Names returns the names, sorted.
func (g *MultiGrant) Names() []string { return g.multi.Names() }

// Grant returns the grant of name, or nil if name is not one of the set.
func (g *MultiGrant) Grant(name string) *Grant {
	p, _ := g.multi.Part(name)
	return p
}

// Token returns the fencing token of name's grant (0 if name is not one of
// the set): what fences a write to the resource that name protects.
func (g *MultiGrant) Token(name string) holdfast.Token { return g.multi.Token(name) }

// Context is cancelled when any part ends: with holdfast.ErrReleased after
// Unlock, else with the first lost part's cause (wrapping
// holdfast.ErrLost), naming it.
func (g *MultiGrant) Context() context.Context { return g.multi.Context() }

// Deadline is the earliest of the parts' safe deadlines.
func (g *MultiGrant) Deadline() time.Time { return g.multi.Deadline() }

// Key returns the key of name's grant ("" if name is not one of the set).
func (g *MultiGrant) Key(name string) string { return g.multi.Key(name) }

// Unlock releases every part concurrently, each as Grant.Unlock does
// (guarded, bounded by ctx, finished in the background if ctx ends first),
// and returns the parts' errors joined.
func (g *MultiGrant) Unlock(ctx context.Context) error { return g.multi.Unlock(ctx) }

// Txn runs ops in one etcd transaction that commits only while every part
// is held: its If compares every part's key with its create revision. If a
// part was released or lost, nothing is applied and the error wraps
// holdfast.ErrNotHeld (and the multi-grant ends). ops may not touch any
// part's keys (see Grant.Txn).
func (g *MultiGrant) Txn(ctx context.Context, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	parts := g.multi.Parts()
	cmps := make([]clientv3.Cmp, 0, len(parts))
	for i, p := range parts {
		if err := p.checkOps(ops); err != nil {
			return nil, err
		}
		cmps = append(cmps, multiPartGuard(p, i == len(parts)-1)...)
	}
	if !g.multi.Held() {
		return nil, g.multi.NotHeld()
	}
	resp, err := g.s.client.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("holdfast/etcd: guarded txn on %v: %w", g.multi.Names(), storeErr(err))
	}
	if !resp.Succeeded {
		g.multi.Lose(fmt.Errorf("%w: a part's key no longer has its create revision (guarded txn failed)", holdfast.ErrLost))
		return nil, g.multi.NotHeld()
	}
	return resp, nil
}
