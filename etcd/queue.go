package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
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
	value string // our key's value: mutexValue for the mutex, a semaphore's limit, a candidate's proposal
	// office: an election's queue, whose key carries value only once it
	// is first (taken office), and "" while it waits (see Election).
	office bool
}

func newQueue(s *Session, pfx string) queue {
	return queue{s: s, pfx: pfx, key: fmt.Sprintf("%s%x", pfx, int64(s.lease))}
}

// ahead is what a waiter knows of the keys ahead of it.
type ahead struct {
	pred *mvccpb.KeyValue // the key just before ours; nil: we hold
	head *mvccpb.KeyValue // the first key, the holder's
	seen int64            // the revision they were read at
}

// tryTurn is a TryLock's join (a joinFunc): it puts our key only if no key
// exists under the prefix, in one request, and fails with an error wrapping
// holdfast.ErrLocked (holdfast.ErrConflict if a key of a longer name is
// there) otherwise.
func (q queue) tryTurn(ctx context.Context) (int64, error) {
	empty := clientv3.Compare(clientv3.CreateRevision(q.pfx), "=", 0).WithPrefix()
	put := clientv3.OpPut(q.key, q.value, clientv3.WithLease(q.s.lease))
	all := clientv3.OpGet(q.pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	head := clientv3.OpGet(q.pfx, clientv3.WithFirstCreate()...) // with its value: a semaphore's?
	resp, err := q.s.client.Txn(ctx).If(empty).Then(put).Else(all, head).Commit()
	if err != nil {
		return unjoined(err), err
	}
	if !resp.Succeeded {
		if err := q.conflict(append(resp.Responses[0].GetResponseRange().GetKvs(), first(resp.Responses[1]))...); err != nil {
			return notJoined, err
		}
		return notJoined, fmt.Errorf("%w: %s", holdfast.ErrLocked, q.pfx[:len(q.pfx)-1])
	}
	return resp.Header.Revision, nil
}

// waitTurn is the FIFO waiting algorithm of the Mutex and the Election (a
// joinFunc): it returns once our key is the first under the prefix. Its
// steps are in docs/DESIGN.md ("etcd FIFO wait"), numbered as below. ctx
// must already end with the session (see acquire).
func (q queue) waitTurn(ctx context.Context) (rev int64, err error) {
	last := clientv3.OpGet(q.pfx, clientv3.WithLastCreate()...)
	head := clientv3.OpGet(q.pfx, clientv3.WithFirstCreate()...)
	put := clientv3.OpPut(q.key, q.value, clientv3.WithLease(q.s.lease))
	if q.office { // the value if we are first, else "" until we are
		empty := clientv3.Compare(clientv3.CreateRevision(q.pfx), "=", 0).WithPrefix()
		put = clientv3.OpTxn([]clientv3.Cmp{empty}, []clientv3.Op{put}, []clientv3.Op{clientv3.OpPut(q.key, "", clientv3.WithLease(q.s.lease))})
	}
	absent := clientv3.Compare(clientv3.CreateRevision(q.key), "=", 0)
	var resp *clientv3.TxnResponse
	// 1. Join. A join that timed out may have applied: the next attempt
	// then finds our key and reuses it (the Else branch).
	err = retry(ctx, func() (err error) {
		resp, err = q.s.client.Txn(ctx).If(absent).Then(last, head, put).Else(clientv3.OpGet(q.key)).Commit()
		return err
	})
	if err != nil {
		return unjoined(err), err
	}
	var a ahead
	if resp.Succeeded {
		rev = resp.Header.Revision // our put's revision is our key's create revision
		a = ahead{pred: first(resp.Responses[0]), head: first(resp.Responses[1]), seen: rev}
		if a.pred == nil && q.office && q.value == "" {
			// An empty value put at once does not mark a leader in
			// office (see Election): write it again.
			if _, err := q.check(ctx, rev, clientv3.OpPut(q.key, "", clientv3.WithLease(q.s.lease))); err != nil {
				return rev, err
			}
		}
	} else {
		mine := first(resp.Responses[0])
		if mine == nil {
			return 0, errors.New("own key vanished")
		}
		rev = mine.CreateRevision
		if !q.office && string(mine.Value) != q.value { // publish our value (an election's: once first, in read)
			put := clientv3.OpPut(q.key, q.value, clientv3.WithLease(q.s.lease))
			if _, err := q.s.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(q.key), "=", rev)).Then(put).Commit(); err != nil {
				return rev, err // else read checks that our key is still ours
			}
		}
		if a, err = q.read(ctx, rev); err != nil {
			return rev, err
		}
	}
	for {
		if err := q.conflict(a.pred, a.head); err != nil {
			return rev, err
		}
		if a.pred == nil {
			return rev, nil
		}
		if a, err = q.wait(ctx, rev, a); err != nil { // 2. and 3.
			return rev, err
		}
	}
}

// conflict returns an error wrapping holdfast.ErrConflict if one of kvs is
// not a contender's key "<prefix><lease hex>" but a key of a longer name
// ("<prefix>b/...", which is also the shape of a read-write lock's keys):
// a lock's name may not be a prefix of another lock's. A key "<prefix>.claim"
// or "<prefix>.run" (a once-per-period claim's record or run mark) is a conflict: a claim's
// record stays, and a waiter behind it would wait for ever. A key carrying a
// semaphore's limit is a conflict too: a lock and a semaphore may not share
// a name. A waiter meets every older key under the prefix as its
// predecessor before it can hold, so checking the keys ahead is enough.
func (q queue) conflict(kvs ...*mvccpb.KeyValue) error {
	for _, kv := range kvs {
		if kv == nil {
			continue
		}
		rest := string(kv.Key[len(q.pfx):])
		if strings.Contains(rest, "/") {
			return fmt.Errorf("%w: %s holds %s, a key of a longer name or of a read-write lock: a lock's name may not be a prefix of another's", holdfast.ErrConflict, q.pfx[:len(q.pfx)-1], kv.Key)
		}
		if rest == ".claim" || rest == ".run" {
			return fmt.Errorf("%w: %s holds %s, a once-per-period claim's key: a lock and a claim may not share a name", holdfast.ErrConflict, q.pfx[:len(q.pfx)-1], kv.Key)
		}
		if strings.HasPrefix(string(kv.Value), semValuePrefix) {
			return fmt.Errorf("%w: %s is a semaphore (%s has value %q): a lock and a semaphore may not share a name", holdfast.ErrConflict, q.pfx[:len(q.pfx)-1], kv.Key, kv.Value)
		}
	}
	return nil
}

// wait waits until a.pred is deleted (step 2) and returns what is ahead
// after that (step 3, read).
//
// The watch starts at the server's current revision, so the server serves it
// at once. (A watch from a past revision, such as a.seen, the revision of
// our read, joins the server's "unsynced" group, served every 100 ms: that is
// the handoff stall of concurrency.Mutex.) If the revision moved between our read and the
// watch's creation, the deletion may fall in that gap. When the predecessor
// is the holder, whose release is imminent, we read again once, with the
// watch in place, so that the wake-up is prompt either way. Otherwise a
// second watch from a.seen+1 covers the gap: exact, and slow only in the
// unlikely case that a waiter deeper in the queue went away in that instant.
func (q queue) wait(ctx context.Context, rev int64, a ahead) (ahead, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	key := string(a.pred.Key)
	now := q.s.client.Watch(wctx, key, predWatch(a.seen))
	var gap clientv3.WatchChan // nil until needed
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case wr, ok = <-now:
		case wr, ok = <-gap:
		}
		if !ok || wr.Canceled || wr.Err() != nil {
			break
		}
		if wr.Created && wr.Header.Revision > a.seen {
			if !same(a.pred, a.head) {
				gap = q.s.client.Watch(wctx, key, clientv3.WithRev(a.seen+1))
				continue
			}
			r, err := q.read(ctx, rev)
			if err != nil || !same(r.pred, a.pred) {
				return r, err
			}
			continue // still there: the watch, created before this read, will see it go
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return q.read(ctx, rev)
			}
		}
	}
	// A watch ended: our context or session ended, the member lost its
	// leader, or history was compacted. Read again (or fail).
	if err := ctx.Err(); err != nil {
		return ahead{}, err
	}
	return q.read(ctx, rev)
}

// same reports whether a and b are the same incarnation of a key.
func same(a, b *mvccpb.KeyValue) bool {
	return a != nil && b != nil && string(a.Key) == string(b.Key) && a.CreateRevision == b.CreateRevision
}

// read checks that our key still has create revision rev and reads what is
// ahead of it. In an election's queue, if no key is ahead, the same Txn
// puts our value: we take office. Transport errors (a leader election, say)
// are retried until ctx ends.
func (q queue) read(ctx context.Context, rev int64) (ahead, error) {
	last := clientv3.OpGet(q.pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))...)
	head := clientv3.OpGet(q.pfx, clientv3.WithFirstCreate()...)
	if !q.office {
		resp, err := q.check(ctx, rev, last, head)
		if err != nil {
			return ahead{}, err
		}
		return ahead{pred: first(resp.Responses[0]), head: first(resp.Responses[1]), seen: resp.Header.Revision}, nil
	}
	firstKey := clientv3.Compare(clientv3.CreateRevision(q.pfx), ">", rev-1).WithPrefix()
	put := clientv3.OpPut(q.key, q.value, clientv3.WithLease(q.s.lease))
	resp, err := q.check(ctx, rev, clientv3.OpTxn([]clientv3.Cmp{firstKey}, []clientv3.Op{put}, []clientv3.Op{last, head}))
	if err != nil {
		return ahead{}, err
	}
	inner := resp.Responses[0].GetResponseTxn()
	if inner.Succeeded {
		return ahead{seen: resp.Header.Revision}, nil
	}
	return ahead{pred: first(inner.Responses[0]), head: first(inner.Responses[1]), seen: resp.Header.Revision}, nil
}

// check runs ops in one Txn that succeeds only if our key still has create
// revision rev, and fails with an error wrapping holdfast.ErrLost if it does
// not. Transport errors are retried until ctx ends.
func (q queue) check(ctx context.Context, rev int64, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	txn := q.s.client.Txn(ctx).If(ownKeyGuard(q.key, rev)...).Then(ops...)
	var resp *clientv3.TxnResponse
	err := retry(ctx, func() (err error) {
		resp, err = txn.Commit()
		return err
	})
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("%w: our key %s was deleted while waiting (lease revoked or key removed)", holdfast.ErrLost, q.key)
	}
	return resp, nil
}

// retry calls attempt, which runs under the caller's ctx, until it succeeds,
// fails with a final error (see core.Final: a refusal, the session's lease
// gone), or ctx ends, with the backends' one backoff (core.Backoff):
// transport errors and the server's timeouts (a leader election, a slow
// disk) are ridden out while the caller waits. It returns the final error
// mapped by storeErr, or ctx's cause.
func retry(ctx context.Context, attempt func() error) error {
	return core.Backoff{}.Retry(ctx, func(context.Context) error { return storeErr(attempt()) })
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

// Counting waiters: the semaphore and the read-write lock. A counting
// waiter holds when fewer than limit keys that block it were created before
// its own; waitCount's steps are in docs/DESIGN.md ("etcd semaphore and
// read-write lock"), numbered as in the code.

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

// conflictScan bounds how many keys a refused join reads to name the one
// whose value differs from ours.
const conflictScan = 256

// waitCount is the counting waiters' algorithm (a joinFunc): it returns
// once fewer than c.limit() keys ahead of ours block us.
func (q queue) waitCount(ctx context.Context, c counter) (rev int64, err error) {
	wch, stop, err := q.watchNow(ctx, c) // 1. watch
	if err != nil {
		return notJoined, err
	}
	defer func() { stop() }()
	var n int
	var seen int64
	// 2. Join. One whose outcome is unknown is sent again: the absent-key
	// compare makes the second reuse our key if the first put it.
	err = retry(ctx, func() (err error) {
		rev, n, seen, err = q.joinCounted(ctx, c)
		return err
	})
	if err != nil {
		return rev, err
	}
	for { // 3. count the events
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
		recount := !ok || wr.Canceled || wr.Err() != nil
		for _, ev := range wr.Events {
			if ev.Kv.ModRevision <= seen {
				continue // already counted
			}
			if ownKeyDeleted(ev, q.key) {
				return rev, fmt.Errorf("%w: our key %s was deleted while waiting (lease revoked or key removed)", holdfast.ErrLost, q.key)
			}
			dec, unsure := c.event(ev, rev)
			n -= dec
			recount = recount || unsure
		}
		if !recount {
			continue
		}
		// 4. The watch broke, or an event could not be classified.
		if err := ctx.Err(); err != nil {
			return rev, err
		}
		if !ok || wr.Canceled || wr.Err() != nil {
			stop()
			if wch, stop, err = q.watchNow(ctx, c); err != nil {
				return rev, err
			}
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

// watchNow opens the counting waiter's watch of the prefix from the
// server's current revision and waits until the server has created it, so
// that it covers every revision after this call returns. Failures are
// retried until ctx ends.
func (q queue) watchNow(ctx context.Context, c counter) (wch clientv3.WatchChan, stop func(), err error) {
	opts := append([]clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify()}, c.watchOpts()...)
	err = retry(ctx, func() error {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		ch := q.s.client.Watch(wctx, q.pfx, opts...)
		select {
		case wr, ok := <-ch:
			if ok && wr.Created && !wr.Canceled && wr.Err() == nil {
				wch, stop = ch, cancel
				return nil
			}
			cancel()
			if ok && wr.Err() != nil {
				return wr.Err()
			}
			return errors.New("watch ended before it was created")
		case <-ctx.Done():
			cancel()
			return ctx.Err()
		}
	})
	return wch, stop, err
}

// joinCounted is step 2: one Txn that puts our key if it is absent and
// counts, before the put, the keys that block us. It returns our key's
// create revision, the count and the revision it was read at.
//
// If our keys carry a value (a semaphore's limit), the put happens only if
// every key under the prefix carries the same value, or the prefix is
// empty; otherwise nothing is written and the error (from
// counter.mismatch) wraps holdfast.ErrConflict. So keys that disagree never
// coexist, and no contender counts against a limit other than its own.
//
// If our key exists already (left in this session by an abandoned attempt),
// it is reused, as the mutex does, and counted with a second Txn.
func (q queue) joinCounted(ctx context.Context, c counter) (rev int64, n int, seen int64, err error) {
	put := clientv3.OpPut(q.key, q.value, clientv3.WithLease(q.s.lease))
	absent := clientv3.Compare(clientv3.CreateRevision(q.key), "=", 0)
	own := clientv3.OpGet(q.key)
	then := append(c.joinOps(), put)
	txn := q.s.client.Txn(ctx)
	if q.value == "" {
		txn = txn.If(absent).Then(then...).Else(own)
	} else {
		cmps := append([]clientv3.Cmp{absent}, limitGuard(q.pfx, q.value)...)
		// Else: the prefix is empty (a value compare on no key fails), or
		// our key exists, or a key carries another value.
		empty := clientv3.Compare(clientv3.CreateRevision(q.pfx), "=", 0).WithPrefix()
		others := clientv3.OpGet(q.pfx, clientv3.WithPrefix(), clientv3.WithLimit(conflictScan))
		txn = txn.If(cmps...).Then(then...).Else(clientv3.OpTxn([]clientv3.Cmp{empty}, []clientv3.Op{put}, []clientv3.Op{own, others}))
	}
	resp, err := txn.Commit()
	if err != nil {
		return unjoined(err), 0, 0, err
	}
	if resp.Succeeded {
		n, err := c.joinCount(resp.Responses[:len(resp.Responses)-1])
		return resp.Header.Revision, n, resp.Header.Revision, err
	}
	rs := resp.Responses
	if q.value != "" {
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
	r, err := q.check(ctx, rev, c.recountOps(rev)...)
	if err != nil {
		return rev, 0, 0, err
	}
	n, err = c.recount(r.Responses, rev)
	return rev, n, r.Header.Revision, err
}
