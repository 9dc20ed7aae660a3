package etcd

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

// semValuePrefix starts the value of every semaphore contender's key; the
// limit follows ("holdfast semaphore limit=4").
const semValuePrefix = "holdfast semaphore "

// Semaphore is a distributed, FIFO, fenced counting semaphore on etcd: at
// most Limit sessions hold a permit of the same name at once.
//
// Its keys have the mutex's layout: every contender puts "<name>/<lease ID
// in hex>", attached to the session's lease, with the value "holdfast
// semaphore limit=<limit>"; a contender holds a permit when fewer than limit
// keys were created before its own (by create revision), so permits are
// granted in order of arrival. A permit is a *Grant like a lock's: its token
// is the create revision of its key, its guarded writes (Grant.Txn) commit
// only while the key exists, the session watches the key so that a revoked
// lease or a deleted key ends the permit within milliseconds, and a crashed
// holder's permit comes back when its lease expires.
//
// Waiting is driven by notifications: each waiter watches the name's
// prefix from before it joins and counts the deletions of keys created
// before its own, so an acquisition costs two requests (join and release)
// whatever the number of contenders. In exchange every waiter is sent every
// deletion under the name (watch events, not requests).
//
// The limit is stored in every key: a contender joins only if every key
// under the name carries its limit (checked in the same transaction as its
// put), so clients that disagree on the limit fail with an error wrapping
// holdfast.ErrLimitMismatch (an ErrConflict) that names both limits, write nothing, and never
// raise the number of holders above the limit of the keys in place. A Mutex
// or RWMutex of the same name conflicts the same way, whichever comes
// second. A semaphore's name may not be a prefix of another lock's at a "/"
// (see Mutex).
//
// A Semaphore belongs to one Session, which holds at most one permit of a
// name at a time: Lock and TryLock may be called from many goroutines, and
// acquisitions of the same name through one Session take turns in-process,
// since they share one key.
type Semaphore struct {
	name    string
	limit   int
	q       queue
	reentry core.Reentry[*Grant]
}

var _ holdfast.GrantLocker[*Grant] = (*Semaphore)(nil)

// NewSemaphore returns the semaphore called name, with at most limit
// holders, taken through session s. The name follows holdfast.ValidateName;
// the semaphore's keys are under "<name>/". limit must be at least 1 (a
// limit of 1 is a lock, but it conflicts with a Mutex of the same name).
func NewSemaphore(s *Session, name string, limit int, opts ...holdfast.LockOption) (*Semaphore, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if limit < 1 {
		return nil, fmt.Errorf("%w: semaphore limit %d is below 1", holdfast.ErrInvalidArgument, limit)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, err
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	q := newQueue(s, name+"/")
	q.value = semValuePrefix + "limit=" + strconv.Itoa(limit)
	return &Semaphore{
		name:    name,
		limit:   limit,
		q:       q,
		reentry: core.Reentry[*Grant]{Enabled: options.ApplyLock(opts).Reentrant},
	}, nil
}

// Lock waits until a permit is granted (in order of arrival), ctx ends, or
// the session ends, and returns within milliseconds of either, even if etcd
// cannot be reached. On error, what the attempt left in etcd (its waiting
// key) is removed by the session in the background, retried while the
// session lives.
func (m *Semaphore) Lock(ctx context.Context) (*Grant, error) {
	return acquire(ctx, m.q, m.name, false, &m.reentry, func(ctx context.Context) (int64, error) {
		return m.q.waitCount(ctx, semCounter{q: m.q, n: m.limit})
	})
}

// TryLock takes a permit only if fewer than Limit keys exist under the name
// (holders and waiters), and returns an error wrapping holdfast.ErrLocked
// otherwise, having written nothing. It costs two requests: a read, then a
// put that applies only if no key under the name changed since.
func (m *Semaphore) TryLock(ctx context.Context) (*Grant, error) {
	return acquire(ctx, m.q, m.name, true, &m.reentry, m.tryAcquire)
}

// tryAcquire reads the keys under the name, and puts ours only if there are
// fewer than limit, all with our limit, and none was created or changed
// since the read (deletions only lower the count). A concurrent change
// makes it read again, until ctx ends.
func (m *Semaphore) tryAcquire(ctx context.Context) (int64, error) {
	q := m.q
	for {
		resp, err := q.s.client.Get(ctx, q.pfx, clientv3.WithPrefix(), clientv3.WithLimit(int64(m.limit)))
		if err != nil {
			return notJoined, err
		}
		for _, kv := range resp.Kvs {
			if string(kv.Key) == q.key {
				// Left by an abandoned attempt of this session, whose
				// cleanup has not finished.
				return notJoined, fmt.Errorf("%w: %s: this session's key is being removed", holdfast.ErrLocked, m.name)
			}
			if limitMismatch(kv, q.value) {
				return notJoined, semCounter{q: q, n: m.limit}.mismatch(kv)
			}
		}
		if resp.Count >= int64(m.limit) {
			return notJoined, fmt.Errorf("%w: %s has %d of %d permits taken or waited for", holdfast.ErrLocked, m.name, resp.Count, m.limit)
		}
		unchanged := clientv3.Compare(clientv3.ModRevision(q.pfx), "<", resp.Header.Revision+1).WithPrefix()
		put := clientv3.OpPut(q.key, q.value, clientv3.WithLease(q.s.lease))
		tr, err := q.s.client.Txn(ctx).If(unchanged).Then(put).Commit()
		if err != nil {
			return unjoined(err), err // the put may have applied
		}
		if tr.Succeeded {
			return tr.Header.Revision, nil
		}
	}
}

// semCounter counts, for a semaphore's contender, every key created before
// its own.
type semCounter struct {
	q queue
	n int
}

func (c semCounter) limit() int { return c.n }

func (c semCounter) watchOpts() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithFilterPut()}
}

func (c semCounter) joinOps() []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(c.q.pfx, clientv3.WithPrefix(), clientv3.WithCountOnly())}
}

func (c semCounter) joinCount(rs []*pb.ResponseOp) (int, error) {
	return int(rs[0].GetResponseRange().Count), nil
}

// recountOps reads the keys ahead (a count-only read would ignore the
// create-revision filter).
func (c semCounter) recountOps(rev int64) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(c.q.pfx, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(rev-1))}
}

func (c semCounter) recount(rs []*pb.ResponseOp, _ int64) (int, error) {
	kvs := rs[0].GetResponseRange().GetKvs()
	for _, kv := range kvs {
		if string(kv.Value) != c.q.value {
			return 0, c.mismatch(kv)
		}
	}
	return len(kvs), nil
}

// event: the deletion of a key created before ours frees a place ahead.
func (c semCounter) event(ev *clientv3.Event, rev int64) (int, bool) {
	if ev.Type != mvccpb.DELETE {
		return 0, false
	}
	if ev.PrevKv == nil {
		return 0, true // the previous value was compacted away: recount
	}
	if wasAhead(ev.PrevKv, rev) {
		return 1, false
	}
	return 0, false
}

// mismatch is the error for a key under the name that does not carry our
// limit (nil: one beyond the keys read).
func (c semCounter) mismatch(kv *mvccpb.KeyValue) error {
	name := strings.TrimSuffix(c.q.pfx, "/")
	switch {
	case kv == nil:
		return fmt.Errorf("%w: semaphore %s with limit %d: a key under the name carries another limit or belongs to another kind of lock", holdfast.ErrConflict, name, c.n)
	case strings.HasPrefix(string(kv.Value), semValuePrefix+"limit="):
		return fmt.Errorf("%w: semaphore %s: this client's limit is %d, but %s has limit %s: clients must agree on the limit", holdfast.ErrLimitMismatch, name, c.n, kv.Key, strings.TrimPrefix(string(kv.Value), semValuePrefix+"limit="))
	default:
		return fmt.Errorf("%w: semaphore %s with limit %d: %s (value %q) belongs to a lock, a read-write lock or a longer name: a semaphore and a lock may not share a name", holdfast.ErrConflict, name, c.n, kv.Key, kv.Value)
	}
}
