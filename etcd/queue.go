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
	s   *Session
	pfx string // "<name>/"
	key string // pfx + lease ID in hex
	val string // the value our key is put with: an election's proposal, else ""
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

// tryAcquire puts our key only if no key exists under the prefix, in one
// request. It returns the key's create revision, or an error wrapping
// holdfast.ErrLocked (holdfast.ErrConflict if a key of a longer name is
// there). On a transport error the put may have applied: the
// caller cleans up with rev 0.
func (q queue) tryAcquire(ctx context.Context) (int64, error) {
	empty := clientv3.Compare(clientv3.CreateRevision(q.pfx), "=", 0).WithPrefix()
	put := clientv3.OpPut(q.key, q.val, clientv3.WithLease(q.s.lease))
	all := clientv3.OpGet(q.pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	resp, err := q.s.client.Txn(ctx).If(empty).Then(put).Else(all).Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		if err := q.conflict(resp.Responses[0].GetResponseRange().GetKvs()...); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: %s", holdfast.ErrLocked, q.pfx[:len(q.pfx)-1])
	}
	return resp.Header.Revision, nil
}

// acquire is the whole waiting algorithm. It returns the create revision of
// our key once we hold, or an error; on error rev is what the caller must
// clean up (0: our key may or may not exist).
//
//  1. Join: one Txn puts our key (if absent) and, before the put, reads the
//     last-created key under the prefix (our predecessor) and the first one
//     (the holder). No predecessor: we hold. If our key existed already
//     (left in this session by an abandoned attempt), reuse it, as
//     concurrency.Mutex does, and read ahead of it as in step 3. If a key
//     ahead belongs to a longer name ("<prefix>b/..."), fail with
//     holdfast.ErrConflict (this check follows every read).
//  2. Wait until the predecessor is deleted, on a watch that starts at the
//     server's current revision (see wait), ending early if ctx or the
//     session ends.
//  3. Re-check our own key and read ahead: one Txn that succeeds only if our
//     key still has our create revision (else our lease or key is gone and
//     we must not take the lock) and reads the new predecessor and holder.
//     No predecessor: we hold. Else go to 2.
//  4. Cleanup (by the caller, in the session's background): on any error our
//     key is deleted if it is still ours.
//
// ctx must already end with the session (see Mutex.Lock).
func (q queue) acquire(ctx context.Context) (rev int64, err error) {
	last := clientv3.OpGet(q.pfx, clientv3.WithLastCreate()...)
	head := clientv3.OpGet(q.pfx, clientv3.WithFirstCreate()...)
	put := clientv3.OpPut(q.key, q.val, clientv3.WithLease(q.s.lease))
	absent := clientv3.Compare(clientv3.CreateRevision(q.key), "=", 0)
	resp, err := q.s.client.Txn(ctx).If(absent).Then(last, head, put).Else(clientv3.OpGet(q.key)).Commit()
	if err != nil {
		return 0, err
	}
	var a ahead
	if resp.Succeeded {
		rev = resp.Header.Revision // our put's revision is our key's create revision
		a = ahead{pred: first(resp.Responses[0]), head: first(resp.Responses[1]), seen: rev}
	} else {
		mine := first(resp.Responses[0])
		if mine == nil {
			return 0, errors.New("own key vanished")
		}
		rev = mine.CreateRevision
		if string(mine.Value) != q.val { // publish our value, as concurrency.Election does
			put := clientv3.OpPut(q.key, q.val, clientv3.WithLease(q.s.lease))
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
		if a, err = q.wait(ctx, rev, a); err != nil {
			return rev, err
		}
	}
}

// conflict returns an error wrapping holdfast.ErrConflict if one of kvs is
// not a contender's key "<prefix><lease hex>" but a key of a longer name
// ("<prefix>b/..."): a lock's name may not be a prefix of another lock's. A
// waiter meets every older key under the prefix as its predecessor before
// it can hold, so checking the keys ahead is enough.
func (q queue) conflict(kvs ...*mvccpb.KeyValue) error {
	for _, kv := range kvs {
		if kv != nil && strings.Contains(string(kv.Key[len(q.pfx):]), "/") {
			return fmt.Errorf("%w: %s holds %s, a key of a longer name: a lock's name may not be a prefix of another's", holdfast.ErrConflict, q.pfx[:len(q.pfx)-1], kv.Key)
		}
	}
	return nil
}

// wait waits until a.pred is deleted and returns what is ahead after that.
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
	var now clientv3.WatchChan
	if !mutant.On("etcd/watch-now") {
		now = q.s.client.Watch(wctx, key, clientv3.WithCreatedNotify())
	} else {
		now = q.s.client.Watch(wctx, key, clientv3.WithRev(a.seen)) // as concurrency.Mutex does
	}
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
// ahead of it. Transport errors (a leader election, say) are retried until
// ctx ends.
func (q queue) read(ctx context.Context, rev int64) (ahead, error) {
	last := clientv3.OpGet(q.pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))...)
	head := clientv3.OpGet(q.pfx, clientv3.WithFirstCreate()...)
	txn := q.s.client.Txn(ctx)
	if !mutant.On("etcd/recheck-own-key") {
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(q.key), "=", rev))
	}
	txn = txn.Then(last, head)
	pause := 20 * time.Millisecond
	for {
		resp, err := txn.Commit()
		if err == nil {
			if !resp.Succeeded {
				return ahead{}, fmt.Errorf("%w: our key %s was deleted while waiting (lease revoked or key removed)", holdfast.ErrLost, q.key)
			}
			return ahead{pred: first(resp.Responses[0]), head: first(resp.Responses[1]), seen: resp.Header.Revision}, nil
		}
		if err = storeErr(err); ctx.Err() != nil || core.Final(err) {
			return ahead{}, err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
			pause = min(2*pause, time.Second)
		case <-ctx.Done():
			t.Stop()
			return ahead{}, err
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
// this session is using the name at that moment.
func (q queue) sweepLateJoin(ctx context.Context, deleted int64) {
	ctx, cancel := context.WithTimeout(ctx, lateJoinWatch)
	defer cancel()
	name := strings.TrimSuffix(q.pfx, "/")
	for wr := range q.s.client.Watch(clientv3.WithRequireLeader(ctx), q.key, clientv3.WithRev(deleted+1), clientv3.WithFilterDelete()) {
		for _, ev := range wr.Events {
			free, ok := q.s.names.TryAcquire(name)
			if !ok {
				return // an acquisition of ours uses the key now: it is its own
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
