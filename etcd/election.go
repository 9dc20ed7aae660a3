package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// Election is a leader election on etcd, with the key layout of
// concurrency.Election: every candidate puts "<name>/<lease ID in hex>",
// attached to its session's lease, with its proposal as the value, and the
// leader is the candidate whose key has the lowest create revision. So
// concurrency.Election (and `etcdctl elect <name>`) campaign against
// holdfast on the same name, in one queue, and every side sees the same
// leader.
//
// Campaign waits in that queue with the Mutex's algorithm (see Mutex), so
// it avoids the holes of the concurrency recipe: a candidate re-checks its
// own key after each wait (a lease that expired while it waited gives no
// phantom leadership), and its key is removed on every error path.
//
// A candidate leads once it has taken office: its key is first and carries
// its value (a waiting holdfast candidate's key has an empty value until
// then; see docs/DESIGN.md), so a candidate that gave up before its turn is
// never reported as leader. concurrency.Election observers may see a new
// holdfast leader's key with an empty value for a moment.
//
// The leader's term is its grant's token: the create revision of its key.
// Leadership is a *Grant: its context is cancelled when the leader's key is
// deleted or its lease is lost (before the lease can expire on the server,
// see WithMargin), and its Txn makes writes fenced by leadership.
//
// An Election belongs to one Session, which campaigns with one key per
// name: Campaign calls through one Session on one name take turns
// in-process (a second Campaign waits until the first one's leadership
// ends). A Mutex and an Election on the same name share the queue.
type Election struct {
	s    *Session
	name string
	ours core.Leadership[*Grant] // the latest leadership won through this Election
}

// NewElection returns the election called name, campaigned through session
// s. The name follows holdfast.ValidateName; the candidates' keys are under
// "<name>/".
func NewElection(s *Session, name string) (*Election, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, err
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	return &Election{s: s, name: name}, nil
}

// Name returns the election's name.
func (e *Election) Name() string { return e.name }

// Campaign puts value as this session's proposal and waits until it is the
// leader (candidates win in order of arrival), ctx ends, or the session
// ends; it returns within milliseconds of either, even if etcd cannot be
// reached, and the session removes the candidate's key in the background.
// The leadership grant's Token is the term, its Context ends when
// leadership is lost, and its Unlock (or Resign) resigns.
//
// If the session's key is already there (left by concurrency.Election on
// the same lease, say), it keeps its place in the queue and its value is
// replaced with value, as concurrency.Election does.
func (e *Election) Campaign(ctx context.Context, value []byte) (*Grant, error) {
	q := newQueue(e.s, e.name+"/")
	q.value, q.office = string(value), true
	g, err := acquire(ctx, q, e.name, false, nil, q.waitTurn)
	if err != nil {
		return nil, err
	}
	e.ours.Won(g, g.base)
	return g, nil
}

// Resign ends this Election's current leadership: the same as Unlock of the
// grant Campaign returned. If this Election does not lead (it never won, or
// its leadership was released or lost), it returns an error wrapping
// holdfast.ErrNotHeld.
func (e *Election) Resign(ctx context.Context) error {
	g, err := e.ours.Current(e.name)
	if err != nil {
		return err
	}
	return g.Unlock(ctx)
}

// Proclaim replaces the leader's published value while this Election
// leads: one transaction that puts value on the leader's key only while it
// has the grant's create revision (the key keeps its lease and its create
// revision, so the term does not change). If this Election does not lead,
// nothing is written and the error wraps holdfast.ErrNotHeld; a Proclaim
// that finds the key gone in etcd also ends the leadership.
func (e *Election) Proclaim(ctx context.Context, value []byte) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	g, err := e.ours.Current(e.name)
	if err != nil {
		return err
	}
	put := clientv3.OpPut(g.Key(), string(value), clientv3.WithLease(e.s.lease))
	resp, err := e.s.client.Txn(ctx).If(proclaimGuard(g)...).Then(put).Commit()
	if err != nil {
		return fmt.Errorf("holdfast/etcd: proclaim on %s: %w", g.Key(), storeErr(err))
	}
	if !resp.Succeeded {
		g.base.Lose(fmt.Errorf("%w: %s no longer has create revision %d", holdfast.ErrLost, g.Key(), g.rev))
		return g.base.NotHeld()
	}
	return nil
}

// Leader returns the current leader: the candidate key with the lowest
// create revision under "<name>/", its value and its create revision as the
// term. With no candidate, or one that has not taken office (see Election),
// it returns an error wrapping holdfast.ErrNoLeader;
// if the first key under "<name>/" belongs to a longer name, one wrapping
// holdfast.ErrConflict.
func (e *Election) Leader(ctx context.Context) (holdfast.Leader, error) {
	if ctx == nil {
		return holdfast.Leader{}, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	q := newQueue(e.s, e.name+"/")
	resp, err := e.s.client.Get(ctx, q.pfx, clientv3.WithFirstCreate()...)
	if err != nil {
		return holdfast.Leader{}, fmt.Errorf("holdfast/etcd: leader of %s: %w", e.name, storeErr(err))
	}
	if len(resp.Kvs) == 0 {
		return holdfast.Leader{}, fmt.Errorf("%w: %s", holdfast.ErrNoLeader, e.name)
	}
	kv := resp.Kvs[0]
	if err := q.conflict(kv); err != nil {
		return holdfast.Leader{}, err
	}
	if !inOffice(kv) {
		return holdfast.Leader{}, fmt.Errorf("%w: %s (the first candidate has not taken office)", holdfast.ErrNoLeader, e.name)
	}
	return holdfast.Leader{Key: string(kv.Key), Value: kv.Value, Term: holdfast.Token(kv.CreateRevision)}, nil
}

// Observe delivers the current leader (the zero holdfast.Leader if there is
// none), then every change, until ctx or the session ends; then the
// channel is closed. A nil ctx gives a closed channel.
//
// On etcd it delivers every leader in order, each once it has taken office
// (see Election: its Campaign has returned, or would have but for its ctx
// ending while its winning request was in flight), again with its new
// value after each Proclaim (same term), and "no leader" whenever no
// candidate is in office: it reads the keys
// under "<name>/" once, then follows every event from the revision of that
// read on one watch, and computes the leader after each revision. Only if
// etcd compacted the history it needs (the watch fell behind by more than
// the compaction window) does it read again, and then it may skip leaders
// that came and went in that stretch. A store outage is retried, not
// reported.
//
// The channel is never what holds the session up: changes are buffered
// for a slow reader (without bound), so read it until it is closed, or end
// ctx.
func (e *Election) Observe(ctx context.Context) <-chan holdfast.Leader {
	out := make(chan holdfast.Leader)
	if ctx == nil {
		close(out)
		return out
	}
	ctx, stop := core.Bind(ctx, e.s.keeper.Context())
	in := make(chan holdfast.Leader)
	go func() {
		defer close(in)
		e.follow(ctx, in)
	}()
	go func() {
		defer stop()
		deliver(ctx, in, out)
	}()
	return out
}

// deliver forwards what comes in to out, in order, buffering without bound,
// until in is closed or ctx ends; then it closes out.
func deliver(ctx context.Context, in <-chan holdfast.Leader, out chan<- holdfast.Leader) {
	defer close(out)
	var pending []holdfast.Leader
	for {
		var send chan<- holdfast.Leader
		var next holdfast.Leader
		if len(pending) > 0 {
			send, next = out, pending[0]
		}
		select {
		case l, ok := <-in:
			if !ok {
				return
			}
			pending = append(pending, l)
		case send <- next:
			pending[0] = holdfast.Leader{}
			pending = pending[1:]
		case <-ctx.Done():
			for range in { // let follow end
			}
			return
		}
	}
}

// contenders is what Observe knows of the keys under the election's prefix.
type contenders map[string]*mvccpb.KeyValue

// leader is the key with the lowest create revision, or the zero Leader.
func (c contenders) leader() holdfast.Leader {
	var best *mvccpb.KeyValue
	for _, kv := range c {
		if best == nil || kv.CreateRevision < best.CreateRevision {
			best = kv
		}
	}
	if best == nil || !inOffice(best) {
		return holdfast.Leader{}
	}
	return holdfast.Leader{Key: string(best.Key), Value: best.Value, Term: holdfast.Token(best.CreateRevision)}
}

// inOffice reports whether the first candidate's key kv marks a leader in
// office: a value, or a second write (see Election). A waiting holdfast
// candidate's key has an empty value, written once.
func inOffice(kv *mvccpb.KeyValue) bool {
	return len(kv.Value) > 0 || kv.Version > 1
}

// sameLeader reports whether a and b are the same leader with the same
// value.
func sameLeader(a, b holdfast.Leader) bool {
	return a.Key == b.Key && a.Term == b.Term && string(a.Value) == string(b.Value)
}

// follow sends the leader on in each time it changes (first the current
// one), until ctx ends. See Observe.
func (e *Election) follow(ctx context.Context, in chan<- holdfast.Leader) {
	pfx := e.name + "/"
	var last holdfast.Leader
	first := true
	emit := func(l holdfast.Leader) bool {
		if !first && sameLeader(l, last) {
			return true
		}
		first, last = false, l
		select {
		case in <- l:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for ctx.Err() == nil {
		var resp *clientv3.GetResponse
		err := core.Backoff{}.Retry(ctx, func(ctx context.Context) (err error) {
			resp, err = e.s.client.Get(ctx, pfx, clientv3.WithPrefix())
			return err
		})
		if err != nil {
			return
		}
		c := contenders{}
		for _, kv := range resp.Kvs {
			c.put(pfx, kv)
		}
		if !emit(c.leader()) {
			return
		}
		rev := resp.Header.Revision
		compacted := false
		for !compacted { // watch from rev+1 until compacted, then read again
			err := core.Backoff{}.Retry(ctx, func(ctx context.Context) error {
				var delivered bool
				compacted, delivered = e.watch(ctx, pfx, c, &rev, emit)
				if ctx.Err() == nil && (compacted || delivered) {
					return nil // a watch that delivered starts the backoff afresh
				}
				return errWatchBroke // the member lost its leader, say: watch again
			})
			if err != nil || ctx.Err() != nil {
				return
			}
		}
	}
}

var errWatchBroke = errors.New("watch broke")

// watch follows the events under pfx after revision *rev on one watch
// stream, keeping c, *rev and the leader (emit) up to date, until the
// stream ends. It reports whether etcd compacted the revisions it needs,
// and whether the stream delivered anything.
func (e *Election) watch(ctx context.Context, pfx string, c contenders, rev *int64, emit func(holdfast.Leader) bool) (compacted, delivered bool) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range e.s.client.Watch(wctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(observeFrom(*rev))) {
		if wr.CompactRevision != 0 {
			return true, delivered
		}
		if wr.Canceled {
			return false, delivered
		}
		for i, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				delete(c, string(ev.Kv.Key))
			} else {
				c.put(pfx, ev.Kv)
			}
			*rev = ev.Kv.ModRevision
			// One revision may hold several events (a revoked lease
			// deletes all its keys at once): the leader is the one after
			// the last of them.
			if i == len(wr.Events)-1 || wr.Events[i+1].Kv.ModRevision != *rev {
				if !emit(c.leader()) {
					return false, delivered
				}
			}
		}
		delivered = true
	}
	return false, delivered
}

// put records kv if it is a candidate's key ("<prefix><lease hex>"; keys of
// longer names are not candidates).
func (c contenders) put(pfx string, kv *mvccpb.KeyValue) {
	if !strings.Contains(string(kv.Key[len(pfx):]), "/") {
		c[string(kv.Key)] = kv
	}
}
