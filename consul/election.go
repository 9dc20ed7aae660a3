package consul

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// Election is a leader election on Consul's documented pattern: the leader
// is the session that holds "<name>/.lock" (flagged like api.Lock's, so
// api.Lock and `consul lock` exclude holdfast candidates and the other way
// round), and the key's value is its proposal. Candidates wait in the
// Mutex's FIFO queue; resigning deletes the key, handing nothing over. The
// term is the ModifyIndex of the write that took the key, readable as its
// CreateIndex after Proclaim (docs/DESIGN.md, "Elections"). An Election
// belongs to one Session; Campaign calls through it take turns.
type Election struct {
	m *Mutex // the lock key and the queue; Lock is never called on it

	mu  sync.Mutex
	cur *Grant // the latest leadership won through this Election
}

// NewElection returns the election called name, campaigned through session
// s. The name follows holdfast.ValidateName; the leader holds the key
// "<name>/.lock" (LockKey(name)).
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
// lock key with value (holdfast candidates win in order of arrival; api.Lock
// clients may take a free key ahead of them), ctx ends, or the session ends,
// with the errors and cleanup of Mutex.Lock. The grant's Token is the term,
// its Context ends when leadership is lost, and its Unlock (or Resign)
// deletes the key, guarded by our session holding it. A key handed over by
// a holdfast Mutex on the same name is written anew with value (a new term).
func (e *Election) Campaign(ctx context.Context, value []byte) (*Grant, error) {
	g, err := acquire(ctx, e.m.s, e.m.name, false, &e.m.reentry, &acquisition{m: e.m, campaign: true, value: value})
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.cur = g
	e.mu.Unlock()
	return g, nil
}

// current returns the latest leadership won through e, or an error wrapping
// holdfast.ErrNotHeld if there is none or it has ended.
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

// Resign ends this Election's current leadership: the same as Unlock of the
// grant Campaign returned. If this Election does not lead (it never won, or
// its leadership was released or lost), it returns an error wrapping
// holdfast.ErrNotHeld.
func (e *Election) Resign(ctx context.Context) error {
	g, err := e.current()
	if err != nil {
		return err
	}
	return g.Unlock(ctx)
}

// Proclaim replaces the leader's published value while this Election
// leads: one transaction that checks that our session holds the lock key
// and acquires it again with value (a write that keeps the key's session,
// flags, CreateIndex and LockIndex, so the term does not change). If this Election does not
// lead, nothing is written and the error wraps holdfast.ErrNotHeld; a
// Proclaim whose check fails in Consul also ends the leadership.
func (e *Election) Proclaim(ctx context.Context, value []byte) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	g, err := e.current()
	if err != nil {
		return err
	}
	s := e.m.s
	ops := proclaimGuard(g)
	// An acquire by the holder keeps the key's session, CreateIndex and
	// LockIndex (a plain set would zero LockIndex), and fails if another
	// session holds the key.
	ops = append(ops, lockOp(g.Key(), s.id, value))
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, err = s.txn(ctx, ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.denied():
		return txnError("proclaim on "+g.Key(), rb)
	case rb != nil:
		g.base.Lose(fmt.Errorf("%w: %s is no longer held by session %s (Proclaim's check failed)", holdfast.ErrLost, g.Key(), s.id))
		s.checkSoon()
		return g.base.NotHeld()
	case err != nil:
		return fmt.Errorf("holdfast/consul: proclaim on %s: %w", g.Key(), err)
	}
	return nil
}

// leaderOf is the leader that the lock key kv shows: none if it is absent
// or free; else its value, and its term (see Election).
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

// Leader returns the current leader: the lock key's value and the term of
// its holder (see Election). If the key is absent or free, it returns an
// error wrapping holdfast.ErrNoLeader; if it is not a lock's key (other
// flags), one wrapping holdfast.ErrConflict.
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

// Observe delivers the current leader (the zero holdfast.Leader if there is
// none), then every change it sees, in order of terms, until ctx or the
// session ends; then the channel is closed (at once for a nil ctx). It
// follows the key with blocking queries: changes between two answers, or
// while the reader is slow (the channel holds only the latest state),
// coalesce; "no leader" is delivered whenever the key is seen free, and a
// Proclaim's value again with the same term. A store outage is retried,
// not reported.
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

// deliver sends out the leaders received from latest, only the newest one
// if out's reader is slower, until latest is closed or ctx ends (then it
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
			for range latest { // let follow end
			}
			return
		}
	}
}

// follow puts the leader in latest (replacing what is there unread) each
// time it changes, first the current one, until ctx ends.
func (e *Election) follow(ctx context.Context, latest chan holdfast.Leader) {
	var last holdfast.Leader
	first := true
	var index uint64
	for ctx.Err() == nil {
		var kv *api.KVPair
		var meta *api.QueryMeta
		err := core.Backoff{Attempt: blockTimeout(blockWait)}.Retry(ctx, func(ctx context.Context) (err error) {
			q := &api.QueryOptions{WaitIndex: index, WaitTime: blockWait}
			kv, meta, err = e.m.s.client.KV().Get(e.m.lockKey(), q.WithContext(ctx))
			return err
		})
		if err != nil {
			return
		}
		if meta.LastIndex < index {
			index = 0 // Consul's index went back (a restored snapshot): start over
		} else {
			index = meta.LastIndex
		}
		l := leaderOf(kv)
		if !first && sameLeader(l, last) {
			continue
		}
		if !first && !l.None() && !last.None() && l.Term < last.Term {
			continue // an older answer (another server's view): terms only go up
		}
		first, last = false, l
		select { // replace what the reader has not taken
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
