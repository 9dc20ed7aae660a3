package consul

import (
	"cmp"
	"context"
	"fmt"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// Election is a leader election on Consul's documented pattern: the leader
// holds "<name>/.lock" (a Mutex's key, so api.Lock excludes it) with its
// proposal as value; candidates wait in the Mutex's FIFO queue. The term is
// the ModifyIndex of the write that took the key (docs/DESIGN.md,
// "Elections"). Campaign calls through one Election take turns.
type Election struct {
	m    *Mutex                  // the lock key and the queue; Lock is never called on it
	ours core.Leadership[*Grant] // the latest leadership won through this Election
}

// NewElection returns the election called name (holdfast.ValidateName),
// campaigned through session s; the leader holds LockKey(name).
func NewElection(s *Session, name string) (*Election, error) {
	m, err := NewMutex(s, name)
	if err != nil {
		return nil, err
	}
	return &Election{m: m}, nil
}

// Name returns the election's name.
func (e *Election) Name() string { return e.m.name }

// Campaign waits in the queue until this session holds the lock key with
// value, with the errors and cleanup of Mutex.Lock. The grant's Token is
// the term; its Unlock (or Resign) deletes the key, guarded.
func (e *Election) Campaign(ctx context.Context, value []byte) (*Grant, error) {
	if value == nil {
		value = []byte{} // a campaign has a value (see acquisition.campaign)
	}
	g, err := acquire(ctx, e.m.s, e.m.name, false, &e.m.reentry, &acquisition{m: e.m, value: value})
	if err != nil {
		return nil, err
	}
	e.ours.Won(g, g.base)
	return g, nil
}

// Resign is Unlock of the grant Campaign returned; without one held, it
// returns an error wrapping holdfast.ErrNotHeld.
func (e *Election) Resign(ctx context.Context) error {
	g, err := e.ours.Current(e.m.name)
	if err != nil {
		return err
	}
	return g.Unlock(ctx)
}

// Proclaim replaces the leader's value, keeping the term, in one
// transaction guarded by our session holding the key. If this Election
// does not lead, nothing is written and the error wraps holdfast.ErrNotHeld
// (a guard that fails in Consul also ends the leadership).
func (e *Election) Proclaim(ctx context.Context, value []byte) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	g, err := e.ours.Current(e.m.name)
	if err != nil {
		return err
	}
	s := e.m.s // an acquire by the holder keeps its CreateIndex and LockIndex
	_, err = s.guardedTxn(ctx, g.base, g.Key(), "session "+s.id, proclaimGuard(g), api.TxnOps{lockOp(g.Key(), s.id, value)})
	return err
}

// leaderOf is the leader that the lock key kv shows: none if absent or
// free; else its value and term (CreateIndex while LockIndex <= 1, which
// Proclaim keeps; else ModifyIndex: an api.Lock holder).
func leaderOf(kv *api.KVPair) holdfast.Leader {
	if kv == nil || kv.Session == "" {
		return holdfast.Leader{}
	}
	term := kv.ModifyIndex
	if kv.LockIndex <= 1 {
		term = kv.CreateIndex
	}
	return holdfast.Leader{Key: kv.Key, Value: kv.Value, Term: holdfast.Token(term)}
}

// Leader returns the current leader. If the key is absent or free, the
// error wraps holdfast.ErrNoLeader; if it is not a lock's,
// holdfast.ErrConflict.
func (e *Election) Leader(ctx context.Context) (holdfast.Leader, error) {
	if ctx == nil {
		return holdfast.Leader{}, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	kv, err := e.m.s.get(ctx, e.m.lockKey(), false)
	if err = cmp.Or(err, e.m.compatibleLock(kv)); err != nil {
		return holdfast.Leader{}, err
	}
	l := leaderOf(kv)
	if l.None() {
		return l, fmt.Errorf("%w: %s", holdfast.ErrNoLeader, e.m.name)
	}
	return l, nil
}

// Observe delivers the current leader (the zero holdfast.Leader for none),
// then each change it sees, in order of terms, until ctx or the session
// ends or Consul refuses the query (then the channel is closed). Changes
// while the reader is slow coalesce; a store outage is retried.
func (e *Election) Observe(ctx context.Context) <-chan holdfast.Leader {
	latest := make(chan holdfast.Leader, 1) // the newest unread leader
	if ctx == nil {
		close(latest)
		return latest
	}
	ctx, stop := core.Bind(ctx, e.m.s.keeper.Context())
	go func() {
		defer close(latest)
		defer stop()
		e.follow(ctx, latest)
	}()
	return latest
}

// follow puts the leader in latest (replacing what is unread) each time it
// changes, until ctx ends or a query is refused (see Session.block).
func (e *Election) follow(ctx context.Context, latest chan holdfast.Leader) {
	var last holdfast.Leader
	var index uint64
	for first := true; ; first = false {
		var kv *api.KVPair
		_, err := e.m.s.block(ctx, "observe "+e.m.name, 0, func(q *api.QueryOptions) (bool, error) {
			q.WaitIndex = index
			p, meta, err := e.m.s.client.KV().Get(e.m.lockKey(), q)
			if err != nil {
				return false, err
			}
			kv, index = p, meta.LastIndex
			if index < q.WaitIndex {
				index = 0 // Consul's index went back (a restored snapshot)
			}
			return true, nil
		})
		if err != nil {
			return
		}
		l := leaderOf(kv)
		same := l.Key == last.Key && l.Term == last.Term && string(l.Value) == string(last.Value)
		if !first && (same || !l.None() && !last.None() && l.Term < last.Term) {
			continue // unchanged, or an older answer: terms only go up
		}
		last = l
		select {
		case <-latest:
		default:
		}
		latest <- l
	}
}
