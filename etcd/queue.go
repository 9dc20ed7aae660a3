package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/mutant"
)

// queue is one session's place in the FIFO queue of keys under a prefix:
// the layout of concurrency.Mutex, where every contender puts
// "<prefix><lease ID in hex>" attached to its lease and the key with the
// lowest create revision holds. The mutex uses it; semaphores and elections
// share it.
//
// One acquisition at a time may use a queue (its key is fixed per session):
// callers hold the session's name slot.
type queue struct {
	s     *Session
	pfx   string // "<name>/"
	key   string // pfx + lease ID in hex (the RW lock's keys add "read/" or "write/")
	value string // our key's value: "" for the mutex; a semaphore's keys carry its limit

	// free, if not nil, says that the last join through this queue found no
	// key blocking it: the next join is sent without the watch (see
	// acquireCounted), so that an uncontended lock costs no watch.
	free *atomic.Bool
}

func newQueue(s *Session, pfx string) queue {
	return queue{s: s, pfx: pfx, key: fmt.Sprintf("%s%x", pfx, int64(s.lease)), free: new(atomic.Bool)}
}

// tryAcquire puts our key only if no key exists under the prefix, in one
// request. It returns the key's create revision, or an error wrapping
// holdfast.ErrLocked (holdfast.ErrConflict if a key of a longer name is
// there). On a transport error the put may have applied: the
// caller cleans up with rev 0.
func (q queue) tryAcquire(ctx context.Context) (int64, error) {
	empty := clientv3.Compare(clientv3.CreateRevision(q.pfx), "=", 0).WithPrefix()
	put := clientv3.OpPut(q.key, q.value, clientv3.WithLease(q.s.lease))
	all := clientv3.OpGet(q.pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	head := clientv3.OpGet(q.pfx, clientv3.WithFirstCreate()...) // with its value: a semaphore's?
	resp, err := q.s.client.Txn(ctx).If(empty).Then(put).Else(all, head).Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		if err := q.conflict(append(resp.Responses[0].GetResponseRange().GetKvs(), first(resp.Responses[1]))...); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: %s", holdfast.ErrLocked, q.pfx[:len(q.pfx)-1])
	}
	return resp.Header.Revision, nil
}

// acquire is the mutex's (and the election's) waiting algorithm: the
// counting waiters' one (see acquireCounted), with a limit of one and the
// keys created before ours as what blocks us (lockCounter). It returns the
// create revision of our key once we hold, or an error; on error rev is what
// the caller must clean up (0: our key may or may not exist; notJoined:
// nothing was written).
//
//  1. Send the creation of a watch of the prefix's deletions, from the
//     server's current revision, and at once
//  2. join: one Txn puts our key (if absent) and, before the put, reads the
//     names of the keys under the prefix (all ahead of us) and the first one
//     with its value. None: we hold, and the watch is cancelled unused. If
//     our key existed already (left in this session by an abandoned
//     attempt), reuse it, as concurrency.Mutex does, and read the keys
//     created before it. A key ahead of a longer name ("<prefix>b/...") or a
//     semaphore's fails with holdfast.ErrConflict.
//  3. Wait: the watch's events come in revision order, with no gap, from the
//     revision it was created at (the server says which). If that is after
//     our join's, one Txn re-reads the keys ahead (with the own-key check);
//     else nothing is read. Each deletion of a key ahead crosses it out; once
//     none is left, we hold. A deletion of our own key, which the same watch
//     delivers in order before the event that would let us in, fails with
//     holdfast.ErrLost: the own-key check costs no request.
//
// So the handoff's critical path is the holder's guarded delete and one
// notification: the waiter sends nothing before it holds.
//
// ctx must already end with the session (see Mutex.Lock).
func (q queue) acquire(ctx context.Context) (rev int64, err error) {
	return q.acquireCounted(ctx, &lockCounter{q: q})
}

// lockCounter: what blocks a mutex's (or a candidate's) key is every key
// created before it. It remembers them by name: the first deletion of a
// name after the read deletes the incarnation that was read (a later
// incarnation of the name is created after our key, behind us).
type lockCounter struct {
	q     queue
	ahead map[string]bool
}

// plain: the keys carry no value that must match ours, and the watch needs
// no previous values.
func (c *lockCounter) plain() {}

func (c *lockCounter) limit() int { return 1 }

func (c *lockCounter) watchOpts() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithFilterPut()}
}

// joinOps: the names of every key (all are ahead of us in the join), and the
// first one with its value (if any key ahead is a semaphore's, the first is:
// a semaphore joins only where every key is one).
func (c *lockCounter) joinOps() []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpGet(c.q.pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(c.q.pfx, clientv3.WithFirstCreate()...),
	}
}

func (c *lockCounter) joinCount(rs []*pb.ResponseOp) (int, error) { return c.count(rs) }

func (c *lockCounter) recountOps(rev int64) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpGet(c.q.pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(rev-1)),
		clientv3.OpGet(c.q.pfx, append(clientv3.WithFirstCreate(), clientv3.WithMaxCreateRev(rev-1))...),
	}
}

func (c *lockCounter) recount(rs []*pb.ResponseOp, _ int64) (int, error) { return c.count(rs) }

func (c *lockCounter) count(rs []*pb.ResponseOp) (int, error) {
	kvs := rs[0].GetResponseRange().GetKvs()
	check := make([]*mvccpb.KeyValue, 0, len(kvs)+1)
	if err := c.q.conflict(append(append(check, kvs...), first(rs[1]))...); err != nil {
		return 0, err
	}
	c.ahead = make(map[string]bool, len(kvs))
	for _, kv := range kvs {
		c.ahead[string(kv.Key)] = true
	}
	return len(c.ahead), nil
}

// event: the deletion of a key ahead (the first after the count) frees our
// way by one.
func (c *lockCounter) event(ev *clientv3.Event, _ int64) (int, bool) {
	if ev.Type != mvccpb.DELETE {
		return 0, false
	}
	if mutant.On("etcd/lock-count") {
		return 1, false // any deletion, as if it were ahead of us
	}
	if key := string(ev.Kv.Key); c.ahead[key] {
		delete(c.ahead, key)
		return 1, false
	}
	return 0, false
}

func (c *lockCounter) mismatch(*mvccpb.KeyValue) error { return nil }

// plainCounter is a counter whose keys carry no value that must match ours
// (the join puts our key without comparing values), and whose watch needs
// no previous values.
type plainCounter interface{ plain() }

// conflict returns an error wrapping holdfast.ErrConflict if one of kvs is
// not a contender's key "<prefix><lease hex>" but a key of a longer name
// ("<prefix>b/...", which is also the shape of a read-write lock's keys):
// a lock's name may not be a prefix of another lock's. A key carrying a
// semaphore's limit is a conflict too: a lock and a semaphore may not share
// a name. A waiter meets every older key under the prefix as its
// predecessor before it can hold, so checking the keys ahead is enough.
func (q queue) conflict(kvs ...*mvccpb.KeyValue) error {
	for _, kv := range kvs {
		if kv != nil && strings.Contains(string(kv.Key[len(q.pfx):]), "/") {
			return fmt.Errorf("%w: %s holds %s, a key of a longer name or of a read-write lock: a lock's name may not be a prefix of another's", holdfast.ErrConflict, q.pfx[:len(q.pfx)-1], kv.Key)
		}
		if kv != nil && strings.HasPrefix(string(kv.Value), semValuePrefix) {
			return fmt.Errorf("%w: %s is a semaphore (%s has value %q): a lock and a semaphore may not share a name", holdfast.ErrConflict, q.pfx[:len(q.pfx)-1], kv.Key, kv.Value)
		}
	}
	return nil
}

// check runs ops in one Txn that succeeds only if our key still has create
// revision rev, and fails with an error wrapping holdfast.ErrLost if it does
// not. Transport errors are retried until ctx ends.
func (q queue) check(ctx context.Context, rev int64, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	txn := q.s.client.Txn(ctx)
	if !mutant.On("etcd/recheck-own-key") {
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(q.key), "=", rev))
	}
	txn = txn.Then(ops...)
	pause := 20 * time.Millisecond
	for {
		resp, err := txn.Commit()
		if err == nil {
			if !resp.Succeeded {
				return nil, fmt.Errorf("%w: our key %s was deleted while waiting (lease revoked or key removed)", holdfast.ErrLost, q.key)
			}
			return resp, nil
		}
		if err = storeErr(err); ctx.Err() != nil || core.Final(err) {
			return nil, err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
			pause = min(2*pause, time.Second)
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
	}
}

// cleanup removes our key after a failed acquisition, as a background task
// of the session: retried while the session lives (each attempt bounded),
// and calling free (the name slot) only when it is over, so that the
// session's next acquisition of the name cannot meet the leftover. With rev
// 0 the put may or may not have applied, and the key is deleted whatever its
// revision: within a session, only the holder of the name slot uses it.
func (q queue) cleanup(rev int64, free func()) {
	var deleted int64 // the revision of our delete
	del := func(ctx context.Context) error {
		txn := q.s.client.Txn(ctx)
		if rev != 0 {
			txn = txn.If(clientv3.Compare(clientv3.CreateRevision(q.key), "=", rev))
		}
		resp, err := txn.Then(clientv3.OpDelete(q.key)).Commit()
		if err == nil {
			deleted = resp.Header.Revision
		}
		return storeErr(err)
	}
	if !q.s.bg.Go(func(ctx context.Context) {
		err := core.Retry(ctx, del)
		free()
		if rev == 0 && err == nil {
			q.sweepLateJoin(ctx, deleted)
		}
	}) {
		free() // the session is closing: revoking its lease removes the key
	}
}

// lateJoinWatch bounds how long the session watches for a join request
// that landed after its cleanup (see sweepLateJoin).
const lateJoinWatch = 30 * time.Second

// sweepLateJoin: our join request, whose outcome we never learnt, may still
// be held somewhere in the network (on another connection than our delete)
// and land after the delete of revision deleted, creating a key that no
// acquisition of ours uses: a stale waiter that would stop the queue behind
// it. For a while (lateJoinWatch, or until the session ends) the session
// watches the key, and removes such a key if no acquisition or grant of
// this session is using the name at that moment, or if the one that does
// uses the name's other key (a read-write lock's reader and writer keys
// differ).
func (q queue) sweepLateJoin(ctx context.Context, deleted int64) {
	ctx, cancel := context.WithTimeout(ctx, lateJoinWatch)
	defer cancel()
	name := strings.TrimSuffix(q.pfx, "/")
	for wr := range q.s.client.Watch(clientv3.WithRequireLeader(ctx), q.key, clientv3.WithRev(deleted+1), clientv3.WithFilterDelete()) {
		for _, ev := range wr.Events {
			free, ok := q.s.names.TryAcquire(name)
			if !ok {
				if k, found := q.s.using.Load(name); !found || k.(string) == q.key {
					return // an acquisition of ours uses the key now: it is its own
				}
				// The acquisition uses the name's other key (a read-write
				// lock has two): this one is stale, and may be ahead of it.
				free = func() {}
			}
			_, _ = q.s.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(q.key), "=", ev.Kv.CreateRevision)).
				Then(clientv3.OpDelete(q.key)).Commit()
			free()
		}
	}
}

// first returns the first key of a range answer in a Txn, or nil.
func first(op *pb.ResponseOp) *mvccpb.KeyValue {
	r := op.GetResponseRange()
	if r == nil || len(r.Kvs) == 0 {
		return nil
	}
	return r.Kvs[0]
}

// Counting waiters: the mutex, the election, the semaphore and the
// read-write lock.
//
// A counting waiter holds when fewer than limit keys that block it were
// created before its own (a mutex's or candidate's key: any key, limit 1; a
// semaphore's permit: any key; a writer: any key, limit 1; a reader:
// writers, limit 1). Its waiting is driven by one watch of the whole
// prefix, whose creation is sent BEFORE the join, and started at the
// server's current revision, so that the server serves it at once (a watch
// from a past revision joins the server's "unsynced" group, served every
// 100 ms: the handoff stall of concurrency.Mutex):
//
//  1. Send the watch's creation (deletions, with their previous value if
//     the counter needs it; the reader also needs puts). Do not wait for it.
//  2. Join: one Txn puts our key (if absent) and, before the put, counts
//     the keys that block us (all of them are ahead of us then). Fewer than
//     limit: we hold (the watch is cancelled unused). A join whose outcome
//     is unknown (transport error) is sent again: if the first one put our
//     key, the second reuses it.
//  3. Wait for the server's confirmation of the watch: it names the
//     revision after which the watch sees every event. If that is after the
//     join's revision (the creation reached the server late), recount in
//     one Txn that also checks that our key still has its create revision;
//     else the watch covers every revision after the join, and nothing is
//     read.
//  4. Wait: every event after the count that removes a key that blocks us
//     lowers the count (the counter says which events count); when it drops
//     below limit, we hold. The watch also covers our own key, and its
//     events come in revision order: if our key was deleted (lease revoked,
//     key removed), we see that before any event that would let us hold, and
//     fail with holdfast.ErrLost. That is the own-key re-check, at the
//     revision of the event that lets us in, and it costs no request.
//  5. If the watch breaks (our member lost its leader, say) or an event
//     cannot be classified, open a new watch, wait for its confirmation,
//     and recount as in step 3.
//  6. Cleanup (queue.cleanup) by the caller.
//
// So an acquisition costs two requests (the join, and the release) however
// many contenders there are, and a handoff is the holder's delete and one
// notification; waiting costs no request, but every waiter is sent every
// deletion under the prefix (watch notifications on its stream, not
// requests), so the server's work per release grows with the number of
// waiters.

// counter says what blocks one counting acquisition.
type counter interface {
	// limit: we hold when fewer keys than this block us.
	limit() int
	// watchOpts filters the prefix watch (deletions only, unless the
	// counter needs puts too).
	watchOpts() []clientv3.OpOption
	// joinOps are the reads of the join Txn, run before our put (so every
	// key they see was created before ours), and joinCount reads their
	// answers: the number of keys that block us, or an error (a conflict).
	joinOps() []clientv3.Op
	joinCount(rs []*pb.ResponseOp) (int, error)
	// recountOps and recount do the same for a key of create revision rev
	// that already exists (a reused key, or after a watch broke).
	recountOps(rev int64) []clientv3.Op
	recount(rs []*pb.ResponseOp, rev int64) (int, error)
	// event returns by how much ev (which comes after the count) lowers the
	// count of a waiter of create revision rev, or unsure: recount.
	event(ev *clientv3.Event, rev int64) (dec int, unsure bool)
	// mismatch is the error for a key under the prefix whose value is not
	// ours (only for queues whose keys carry a value).
	mismatch(kv *mvccpb.KeyValue) error
}

// notJoined is the revision returned by a failed counting acquisition that
// wrote nothing: the caller has nothing to clean up.
const notJoined = -1

// conflictScan bounds how many keys a refused join reads to name the one
// whose value differs from ours.
const conflictScan = 256

// acquireCounted is the counting waiters' algorithm (see above). It returns
// the create revision of our key once we hold, or an error and what the
// caller must clean up (rev 0: our key may or may not exist; notJoined:
// nothing was written).
func (q queue) acquireCounted(ctx context.Context, c counter) (rev int64, err error) {
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer func() { stop() }()
	var wch clientv3.WatchChan
	now := !mutant.On("etcd/watch-now")
	if now && (q.free == nil || !q.free.Load()) {
		wch = q.s.client.Watch(wctx, q.pfx, q.watchOpts(c)...) // from the current revision
	}
	var n int
	var seen int64
	for pause := 20 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		rev, n, seen, err = q.joinCounted(ctx, c)
		if err == nil {
			break
		}
		if rev != 0 || ctx.Err() != nil || core.Final(storeErr(err)) {
			return rev, err
		}
		// A transport error (or the server's "request timed out"): the join
		// may have applied. Join again: the absent-key compare makes the
		// second join reuse our key if the first one put it, and a first
		// join that lands late writes nothing.
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, err
		}
	}
	if q.free != nil {
		q.free.Store(n == 0)
	}
	switch {
	case n < c.limit():
		return rev, nil
	case !now:
		// As concurrency.Mutex does: from the revision of our read, which the
		// server serves only in its 100 ms unsynced loop once it has moved on.
		wch = q.s.client.Watch(wctx, q.pfx, append(q.watchOpts(c), clientv3.WithRev(seen))...)
	case wch == nil:
		// The last join found the way free, so this one was sent alone: watch
		// now, from the current revision (recounting if it moved past seen).
		wch = q.s.client.Watch(wctx, q.pfx, q.watchOpts(c)...)
	}
	for {
		if n < c.limit() {
			return rev, nil
		}
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case wr, ok = <-wch:
		case <-ctx.Done():
			return rev, ctx.Err()
		}
		broken := !ok || wr.Canceled || wr.Err() != nil
		// Created after our count's revision: events in between may be lost.
		recount := broken || now && wr.Created && wr.Header.Revision > seen
		for _, ev := range wr.Events {
			if ev.Kv.ModRevision <= seen {
				continue // already counted
			}
			if string(ev.Kv.Key) == q.key && ev.Type == mvccpb.DELETE && !mutant.On("etcd/semaphore-own-key") && !mutant.On("etcd/recheck-own-key") {
				return rev, fmt.Errorf("%w: our key %s was deleted while waiting (lease revoked or key removed)", holdfast.ErrLost, q.key)
			}
			dec, unsure := c.event(ev, rev)
			n -= dec
			recount = recount || unsure
		}
		if !recount {
			continue
		}
		if err := ctx.Err(); err != nil {
			return rev, err
		}
		if broken {
			stop()
			if wch, stop, err = q.watchNow(ctx, c); err != nil {
				return rev, err
			}
			now = true
		}
		resp, err := q.check(ctx, rev, c.recountOps(rev)...)
		if err != nil {
			return rev, err
		}
		if n, err = c.recount(resp.Responses, rev); err != nil {
			return rev, err
		}
		seen = resp.Header.Revision
	}
}

// watchOpts are the options of a counting waiter's watch of the prefix.
func (q queue) watchOpts(c counter) []clientv3.OpOption {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify()}
	if _, plain := c.(plainCounter); !plain {
		opts = append(opts, clientv3.WithPrevKV())
	}
	return append(opts, c.watchOpts()...)
}

// watchNow opens the counting waiter's watch of the prefix from the
// server's current revision and waits until the server has created it, so
// that it covers every revision after this call returns. Failures are
// retried until ctx ends.
func (q queue) watchNow(ctx context.Context, c counter) (clientv3.WatchChan, func(), error) {
	pause := 20 * time.Millisecond
	for {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := q.s.client.Watch(wctx, q.pfx, q.watchOpts(c)...)
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case wr, ok = <-wch:
		case <-ctx.Done():
			cancel()
			return nil, nil, ctx.Err()
		}
		if ok && wr.Created && !wr.Canceled && wr.Err() == nil {
			return wch, cancel, nil
		}
		cancel()
		t := time.NewTimer(pause)
		select {
		case <-t.C:
			pause = min(2*pause, time.Second)
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		}
	}
}

// joinCounted is step 2: one Txn that puts our key if it is absent and
// counts, before the put, the keys that block us. It returns our key's
// create revision, the count and the revision it was read at.
//
// If our keys carry a value that every key must share (a semaphore's
// limit), the put happens only if every key under the prefix carries the
// same value, or the prefix is empty; otherwise nothing is written and the
// error (from counter.mismatch) wraps holdfast.ErrConflict. So keys that
// disagree never coexist, and no contender counts against a limit other
// than its own.
//
// If our key exists already (left in this session by an abandoned attempt),
// it is reused, as concurrency.Mutex does, and counted with a second Txn
// (which also publishes our value if the key has another: an election's
// proposal, as concurrency.Election does).
func (q queue) joinCounted(ctx context.Context, c counter) (rev int64, n int, seen int64, err error) {
	put := clientv3.OpPut(q.key, q.value, clientv3.WithLease(q.s.lease))
	absent := clientv3.Compare(clientv3.CreateRevision(q.key), "=", 0)
	own := clientv3.OpGet(q.key)
	then := append(c.joinOps(), put)
	txn := q.s.client.Txn(ctx)
	_, plain := c.(plainCounter)
	uniform := q.value != "" && !plain
	if !uniform {
		txn = txn.If(absent).Then(then...).Else(own)
	} else {
		cmps := []clientv3.Cmp{absent}
		if !mutant.On("etcd/semaphore-limit") {
			cmps = append(cmps, clientv3.Compare(clientv3.Value(q.pfx), "=", q.value).WithPrefix())
		}
		// Else: the prefix is empty (a value compare on no key fails), or
		// our key exists, or a key carries another value.
		empty := clientv3.Compare(clientv3.CreateRevision(q.pfx), "=", 0).WithPrefix()
		others := clientv3.OpGet(q.pfx, clientv3.WithPrefix(), clientv3.WithLimit(conflictScan))
		txn = txn.If(cmps...).Then(then...).Else(clientv3.OpTxn([]clientv3.Cmp{empty}, []clientv3.Op{put}, []clientv3.Op{own, others}))
	}
	resp, err := txn.Commit()
	if err != nil {
		return 0, 0, 0, err
	}
	if resp.Succeeded {
		n, err := c.joinCount(resp.Responses[:len(resp.Responses)-1])
		return resp.Header.Revision, n, resp.Header.Revision, err
	}
	rs := resp.Responses
	if uniform {
		inner := rs[0].GetResponseTxn()
		if inner.Succeeded { // the prefix was empty: we hold
			return resp.Header.Revision, 0, resp.Header.Revision, nil
		}
		rs = inner.Responses
		mine := first(rs[0])
		var other *mvccpb.KeyValue
		for _, kv := range rs[1].GetResponseRange().GetKvs() {
			if string(kv.Value) != q.value {
				other = kv
				break
			}
		}
		switch {
		case mine == nil && other == nil:
			return notJoined, 0, 0, c.mismatch(nil) // beyond the keys read
		case mine == nil:
			return notJoined, 0, 0, c.mismatch(other)
		case other != nil:
			return mine.CreateRevision, 0, 0, c.mismatch(other)
		}
	}
	mine := first(rs[0])
	if mine == nil {
		return 0, 0, 0, errors.New("own key vanished")
	}
	rev = mine.CreateRevision
	ops := c.recountOps(rev)
	publish := !uniform && string(mine.Value) != q.value
	if publish {
		ops = append([]clientv3.Op{put}, ops...)
	}
	r, err := q.check(ctx, rev, ops...)
	if err != nil {
		return rev, 0, 0, err
	}
	rs = r.Responses
	if publish {
		rs = rs[1:]
	}
	n, err = c.recount(rs, rev)
	return rev, n, r.Header.Revision, err
}
