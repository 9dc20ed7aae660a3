package consul

import (
	"context"
	"fmt"
	"sync"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// Election is a leader election on Consul's documented pattern: the leader
// is the session that holds "<name>/.lock" (flagged like api.Lock's, which
// excludes api.Lock and `consul lock` users and the other way round), with
// its proposal as value. Candidates wait in the Mutex's FIFO queue;
// resigning deletes the key. The term is the ModifyIndex of the write that
// took the key (docs/DESIGN.md, "Elections"). An Election belongs to one
// Session; Campaign calls through it take turns.
type Election struct {
	m *Mutex // the lock key and the queue; Lock is never called on it

	mu  sync.Mutex
	cur *Grant // the latest leadership won through this Election
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

// Campaign queues this session as a candidate and waits until it holds the
// lock key with value (holdfast candidates in order of arrival), with the
// errors and cleanup of Mutex.Lock. The grant's Token is the term, its
// Context ends when leadership is lost, and its Unlock (or Resign) deletes
// the key, guarded by our session holding it.
func (e *Election) Campaign(ctx context.Context, value []byte) (*Grant, error) {
	if value == nil {
		value = []byte{} // a campaign has a value (see acquisition.campaign)
	}
	g, err := acquire(ctx, e.m.s, e.m.name, false, &e.m.reentry, &acquisition{m: e.m, value: value})
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.cur = g
	e.mu.Unlock()
	return g, nil
}

// current returns the leadership we hold, or an error wrapping
// holdfast.ErrNotHeld.
func (e *Election) current() (*Grant, error) {
	e.mu.Lock()
	g := e.cur
	e.mu.Unlock()
	if g == nil {
		return nil, fmt.Errorf("%w: not the leader of %s", holdfast.ErrNotHeld, e.m.name)
	}
	if !g.base.Held() {
		return nil, g.base.NotHeld()
	}
	return g, nil
}

// Resign is Unlock of the grant Campaign returned; without one held, it
// returns an error wrapping holdfast.ErrNotHeld.
func (e *Election) Resign(ctx context.Context) error {
	g, err := e.current()
	if err != nil {
		return err
	}
	return g.Unlock(ctx)
}

// Proclaim replaces the leader's value while this Election leads, in one
// transaction guarded by our session holding the key (the term stays). If
// it does not lead, nothing is written and the error wraps
// holdfast.ErrNotHeld; a guard that fails in Consul also ends the
// leadership.
func (e *Election) Proclaim(ctx context.Context, value []byte) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	g, err := e.current()
	if err != nil {
		return err
	}
	s := e.m.s
	// An acquire by the holder keeps the key's session, CreateIndex and
	// LockIndex (a set would zero LockIndex).
	_, err = s.guardedTxn(ctx, g.Key(), proclaimGuard(g), api.TxnOps{lockOp(g.Key(), s.id, value)}, func() error {
		g.base.Lose(fmt.Errorf("%w: %s is no longer held by session %s (Proclaim's check failed)", holdfast.ErrLost, g.Key(), s.id))
		s.checkSoon()
		return g.base.NotHeld()
	})
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
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	kv, _, err := e.m.s.client.KV().Get(e.m.lockKey(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return holdfast.Leader{}, apiError("leader of "+e.m.name, err)
	}
	if err := e.m.compatibleLock(kv); err != nil {
		return holdfast.Leader{}, err
	}
	l := leaderOf(kv)
	if l.None() {
		return l, fmt.Errorf("%w: %s", holdfast.ErrNoLeader, e.m.name)
	}
	return l, nil
}

// Observe delivers the current leader (the zero holdfast.Leader for none),
// then every change it sees, in order of terms, until ctx or the session
// ends, or Consul refuses the query (an ACL); then the channel is closed
// (at once for a nil ctx). Changes between two answers of its blocking
// queries, or while the reader is slow, coalesce; a Proclaim's value comes
// again with the same term. A store outage is retried, not reported.
func (e *Election) Observe(ctx context.Context) <-chan holdfast.Leader {
	out := make(chan holdfast.Leader)
	if ctx == nil {
		close(out)
		return out
	}
	ctx, stop := e.m.s.bind(ctx)
	latest := make(chan holdfast.Leader, 1)
	go func() {
		defer close(latest)
		e.follow(ctx, latest)
	}()
	go func() {
		defer stop()
		defer close(out)
		deliver(ctx, latest, out)
	}()
	return out
}

// deliver sends out the leaders received from latest, only the newest if
// out's reader is slower, until latest is closed or ctx ends (then it
// drains latest until follow closes it).
func deliver(ctx context.Context, latest <-chan holdfast.Leader, out chan<- holdfast.Leader) {
	var pending holdfast.Leader
	var send chan<- holdfast.Leader // out while pending is unsent
	for {
		select {
		case l, ok := <-latest:
			if !ok {
				return
			}
			pending, send = l, out
		case send <- pending:
			send = nil
		case <-ctx.Done():
			for range latest {
			}
			return
		}
	}
}

// follow puts the leader in latest (replacing what is unread) each time it
// changes, first the current one, until ctx ends or a query is refused
// (see Session.block).
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
		if !first && (sameLeader(l, last) || !l.None() && !last.None() && l.Term < last.Term) {
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

// sameLeader reports whether a and b are the same leader with the same
// value.
func sameLeader(a, b holdfast.Leader) bool {
	return a.Key == b.Key && a.Term == b.Term && string(a.Value) == string(b.Value)
}
