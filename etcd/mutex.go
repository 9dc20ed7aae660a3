package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

const (
	// cleanupTimeout bounds the removal of a waiter's key after Lock fails.
	cleanupTimeout = 5 * time.Second
	// watchDelay is how long a grant is held before it watches its own key
	// for deletion: short critical sections do not pay for a watch, and a
	// revoked lease is noticed within about twice this, or at the next
	// keepalive (TTL/3), whichever comes first.
	watchDelay = 100 * time.Millisecond
)

// Mutex is a distributed, FIFO, fenced lock on etcd. Its keys are those of
// concurrency.Mutex: "<name>/<lease ID in hex>", attached to the session's
// lease; the holder is the key with the lowest create revision.
//
// A Mutex belongs to one Session. Lock and TryLock may be called from many
// goroutines: through one Session, acquisitions of the same name take turns
// in-process, since they share one key.
type Mutex struct {
	s       *Session
	name    string
	pfx     string // name + "/"
	key     string // pfx + lease ID in hex
	reentry core.Reentry[*Grant]
}

// NewMutex returns the lock called name, taken through session s. The name is
// a key prefix; it follows holdfast.ValidateName.
func NewMutex(s *Session, name string, opts ...holdfast.LockOption) (*Mutex, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, err
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	cfg := options.ApplyLock(opts)
	pfx := name + "/"
	return &Mutex{
		s:       s,
		name:    name,
		pfx:     pfx,
		key:     fmt.Sprintf("%s%x", pfx, int64(s.lease)),
		reentry: core.Reentry[*Grant]{Enabled: cfg.Reentrant},
	}, nil
}

// Name returns the lock's name.
func (m *Mutex) Name() string { return m.name }

// Key returns the key this Mutex's session holds or waits on.
func (m *Mutex) Key() string { return m.key }

// Lock waits until the lock is granted (in order of arrival), ctx is done, or
// the session ends. On error nothing of this call is left in etcd. The
// returned grant is an *etcd.Grant.
func (m *Mutex) Lock(ctx context.Context) (holdfast.Grant, error) { return m.lock(ctx, true) }

// TryLock takes the lock only if no key exists under the name (no holder, no
// waiter), in one request, and returns an error wrapping holdfast.ErrLocked
// otherwise. It writes nothing when it fails.
func (m *Mutex) TryLock(ctx context.Context) (holdfast.Grant, error) { return m.lock(ctx, false) }

func (m *Mutex) lock(ctx context.Context, wait bool) (holdfast.Grant, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if err := m.s.alive(); err != nil {
		return nil, err
	}
	if g, ok := m.reentry.Enter(); ok {
		return g, nil
	}
	// One acquisition per name at a time through this session: they would
	// share one key.
	var free func()
	var rev int64
	var err error
	if wait {
		if free, err = m.s.names.Acquire(ctx, m.name); err != nil {
			return nil, fmt.Errorf("holdfast/etcd: lock %s: %w", m.name, err)
		}
		rev, err = m.acquire(ctx)
	} else {
		var ok bool
		if free, ok = m.s.names.TryAcquire(m.name); !ok {
			return nil, fmt.Errorf("%w: %s is being taken through this session", holdfast.ErrLocked, m.name)
		}
		rev, err = m.tryAcquire(ctx)
	}
	if err == nil {
		err = m.s.alive() // never hand out a grant of a session already lost
		if err != nil {
			m.cleanup(ctx, rev)
		}
	}
	if err != nil {
		free()
		return nil, err
	}
	g := &Grant{client: m.s.client, rev: rev}
	g.base = core.NewGrant(m.s.keeper, m.s.bg, m.key, holdfast.Token(rev), g.release, free)
	time.AfterFunc(watchDelay, g.watch)
	m.reentry.Remember(g, g.base)
	return g, nil
}

// tryAcquire puts our key only if the name has no key at all.
func (m *Mutex) tryAcquire(ctx context.Context) (int64, error) {
	empty := clientv3.Compare(clientv3.CreateRevision(m.pfx), "=", 0).WithPrefix()
	put := clientv3.OpPut(m.key, "", clientv3.WithLease(m.s.lease))
	resp, err := m.s.client.Txn(ctx).If(empty).Then(put).Commit()
	if err != nil {
		m.cleanup(ctx, 0) // the put may have applied before the error
		return 0, m.wrap(ctx, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: %s", holdfast.ErrLocked, m.name)
	}
	return resp.Header.Revision, nil
}

// acquire is the whole waiting algorithm:
//
//  1. One Txn puts our key (if absent) and, before the put, reads the
//     last-created key under the name (our predecessor) and the first one
//     (the holder). No predecessor means we hold the lock.
//  2. Otherwise watch the predecessor until it is deleted (see next).
//  3. When it is gone, one Txn checks that our key still has our create
//     revision (our lease is alive) and reads the new predecessor and
//     holder. No predecessor: we hold the lock. Else go to 2.
func (m *Mutex) acquire(ctx context.Context) (rev int64, err error) {
	defer func() {
		if err != nil {
			m.cleanup(ctx, rev)
			err = m.wrap(ctx, err)
		}
	}()
	last := clientv3.OpGet(m.pfx, clientv3.WithLastCreate()...)
	head := clientv3.OpGet(m.pfx, clientv3.WithFirstCreate()...)
	put := clientv3.OpPut(m.key, "", clientv3.WithLease(m.s.lease))
	absent := clientv3.Compare(clientv3.CreateRevision(m.key), "=", 0)
	resp, err := m.s.client.Txn(ctx).If(absent).Then(last, head, put).Else(clientv3.OpGet(m.key)).Commit()
	if err != nil {
		return 0, err
	}
	var q queue
	if resp.Succeeded {
		rev = resp.Header.Revision // our put's revision is our key's create revision
		q = queue{pred: first(resp.Responses[0]), head: first(resp.Responses[1]), seen: rev}
	} else {
		// Our key exists already: left by an earlier holder in this session
		// whose Unlock did not complete. Reuse it, as concurrency.Mutex does.
		mine := first(resp.Responses[0])
		if mine == nil {
			return 0, errors.New("own key vanished")
		}
		rev = mine.CreateRevision
		if q, err = m.read(ctx, rev); err != nil {
			return rev, err
		}
	}
	for q.pred != nil {
		if q, err = m.next(ctx, rev, q); err != nil {
			return rev, err
		}
	}
	return rev, nil
}

// queue is what a waiter knows of the keys ahead of it.
type queue struct {
	pred *mvccpb.KeyValue // the key just before ours; nil: the lock is ours
	head *mvccpb.KeyValue // the first key, the holder's
	seen int64            // the revision they were read at
}

// next waits until q.pred is deleted and returns the queue read after that.
//
// The watch starts at the server's current revision, so the server serves it
// at once. (A watch from a past revision, such as q.seen+1, joins the
// server's "unsynced" group, served every 100 ms: that is the handoff stall
// of concurrency.Mutex.) If the revision moved between our read and the
// watch's creation, the deletion may fall in that gap. When the predecessor
// is the holder, whose release is imminent, we read again once, with the
// watch in place, so that the wake-up is prompt either way. Otherwise a
// second watch from q.seen+1 covers the gap: exact, and slow only in the
// unlikely case that a waiter deeper in the queue went away in that instant.
func (m *Mutex) next(ctx context.Context, rev int64, q queue) (queue, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	stop := context.AfterFunc(m.s.keeper.Context(), cancel)
	defer stop()
	key := string(q.pred.Key)
	now := m.s.client.Watch(wctx, key, clientv3.WithCreatedNotify())
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
		if wr.Created && wr.Header.Revision > q.seen {
			if !same(q.pred, q.head) {
				gap = m.s.client.Watch(wctx, key, clientv3.WithRev(q.seen+1))
				continue
			}
			r, err := m.read(ctx, rev)
			if err != nil || !same(r.pred, q.pred) {
				return r, err
			}
			continue // still there: the watch, created before this read, will see it go
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return m.read(ctx, rev)
			}
		}
	}
	// A watch ended: our context or session ended, the member lost its
	// leader, or history was compacted. Read again (or fail).
	if err := m.s.alive(); err != nil {
		return queue{}, err
	}
	if err := ctx.Err(); err != nil {
		return queue{}, err
	}
	return m.read(ctx, rev)
}

// same reports whether a and b are the same incarnation of a key.
func same(a, b *mvccpb.KeyValue) bool {
	return a != nil && b != nil && string(a.Key) == string(b.Key) && a.CreateRevision == b.CreateRevision
}

// read checks that our key still has create revision rev and reads the
// queue ahead of it. Transient errors are retried until ctx is done or the
// session ends.
func (m *Mutex) read(ctx context.Context, rev int64) (queue, error) {
	mine := clientv3.Compare(clientv3.CreateRevision(m.key), "=", rev)
	last := clientv3.OpGet(m.pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))...)
	head := clientv3.OpGet(m.pfx, clientv3.WithFirstCreate()...)
	pause := 20 * time.Millisecond
	for {
		resp, err := m.s.client.Txn(ctx).If(mine).Then(last, head).Commit()
		if err == nil {
			if !resp.Succeeded {
				return queue{}, fmt.Errorf("%w: our key %s was deleted while waiting (lease expired or revoked)", holdfast.ErrSessionLost, m.key)
			}
			return queue{pred: first(resp.Responses[0]), head: first(resp.Responses[1]), seen: resp.Header.Revision}, nil
		}
		if ctx.Err() != nil || m.s.alive() != nil || errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return queue{}, err
		}
		select { // e.g. a leader election in progress
		case <-time.After(pause):
			pause = min(2*pause, time.Second)
		case <-ctx.Done():
			return queue{}, err
		case <-m.s.keeper.Context().Done():
			return queue{}, err
		}
	}
}

// cleanup removes our key after a failed Lock, with its own bounded context
// (ctx may be the reason we failed). With rev 0 the put may or may not have
// applied, and the key is removed whatever its revision: within one session
// the key of a name is only used by the acquisition holding the name's slot.
func (m *Mutex) cleanup(ctx context.Context, rev int64) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	del := clientv3.OpDelete(m.key)
	if rev == 0 {
		_, _ = m.s.client.Delete(cctx, m.key)
		return
	}
	_, _ = m.s.client.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(m.key), "=", rev)).Then(del).Commit()
}

// wrap turns store errors into holdfast errors. Context errors come back as
// the context's own error, so errors.Is(err, context.Canceled) works.
func (m *Mutex) wrap(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("holdfast/etcd: lock %s: %w", m.name, ctx.Err())
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		m.s.keeper.End(fmt.Errorf("%w: lease %x not found", holdfast.ErrSessionLost, int64(m.s.lease)))
		return fmt.Errorf("holdfast/etcd: lock %s: %w", m.name, m.s.alive())
	case errors.Is(err, holdfast.ErrLost), errors.Is(err, holdfast.ErrSessionClosed), errors.Is(err, holdfast.ErrLocked):
		return fmt.Errorf("holdfast/etcd: lock %s: %w", m.name, err)
	}
	if serr := m.s.alive(); serr != nil {
		return fmt.Errorf("holdfast/etcd: lock %s: %w", m.name, serr)
	}
	return fmt.Errorf("holdfast/etcd: lock %s: %w", m.name, err)
}

// first returns the first key of a range answer in a Txn, or nil.
func first(op *etcdserverpb.ResponseOp) *mvccpb.KeyValue {
	r := op.GetResponseRange()
	if r == nil || len(r.Kvs) == 0 {
		return nil
	}
	return r.Kvs[0]
}
