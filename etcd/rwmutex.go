package etcd

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

// RWMutex is a distributed, FIFO, fenced read-write lock on etcd: readers
// share it, a writer excludes everyone, and a reader queued behind a writer
// waits for it, so writers do not starve.
//
// Its keys are those of etcd's recipe.RWMutex
// (go.etcd.io/etcd/client/v3/experimental/recipes): a reader puts
// "<name>/read/<lease ID in hex>", a writer "<name>/write/<lease ID in
// hex>", attached to the session's lease (the recipe puts a timestamp where
// holdfast puts the lease). A writer holds when no key under "<name>/" was
// created before its own; a reader, when no write key was. So holdfast and
// recipe.RWMutex exclude each other on the same name, in both directions.
//
// Tokens: every grant's token is the create revision of its key, so tokens
// strictly increase across write grants, and a read grant's token lies
// between the tokens of the writers around it: above every writer that held
// before it, below every writer that holds after it. A resource that
// remembers the highest writer token it has seen can thus refuse a reader
// whose token is lower (the reader's view predates that write), and a
// writer whose token is lower than a reader's that it has served.
//
// Downgrade turns a write grant into a read grant in place: it puts the
// marker key "<name>/.down" (attached to the lease, naming the write key and
// its create revision), guarded by the write key, which it leaves untouched.
// Readers queued behind the write key see the marker and come in; writers
// queued behind it keep waiting for it, in their places. The write key is
// not rewritten (a put would keep its create revision, but raise its mod
// revision above the recipe's queued writers, which order keys by mod
// revision and would then stop waiting for it: unsafe). recipe.RWMutex
// contenders do not know the marker: its readers keep treating the
// downgraded key as a writer (safe, only slower), its writers wait for it
// and for the marker as for any older key. The read grant keeps the write
// grant's key and token; its release deletes the key and the marker
// together.
//
// Waiting is driven by notifications, as for Semaphore: each waiter watches
// the name's prefix from before it joins and counts what blocks it, so an
// acquisition costs two requests (join and release); every waiter is sent
// every deletion under the name (a reader, every put too). A RWMutex
// conflicts (holdfast.ErrConflict, for whoever comes second) with a Mutex
// or a Semaphore of the same name. A Mutex named "<name>/read" or
// "<name>/write" has the same keys as this lock's readers or writers, so it
// cannot be told apart; it behaves as one of them.
//
// A RWMutex belongs to one Session, which holds at most one grant of a name
// at a time (read or write): acquisitions of the same name through one
// Session take turns in-process.
type RWMutex struct {
	name   string
	rq, wq queue
	marker string // "<name>/.down"
}

// NewRWMutex returns the read-write lock called name, taken through session
// s. The name follows holdfast.ValidateName; the lock's keys are under
// "<name>/". Reentrant grants (holdfast.WithReentrant) are not supported.
func NewRWMutex(s *Session, name string, opts ...holdfast.LockOption) (*RWMutex, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, err
	}
	if options.ApplyLock(opts).Reentrant {
		return nil, fmt.Errorf("%w: a read-write lock is not reentrant", holdfast.ErrInvalidArgument)
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	pfx := name + "/"
	lease := fmt.Sprintf("%x", int64(s.lease))
	return &RWMutex{
		name:   name,
		rq:     queue{s: s, pfx: pfx, key: pfx + "read/" + lease},
		wq:     queue{s: s, pfx: pfx, key: pfx + "write/" + lease},
		marker: pfx + ".down",
	}, nil
}

// Lock waits until the lock is granted for writing (in order of arrival),
// ctx ends, or the session ends, as Mutex.Lock.
func (rw *RWMutex) Lock(ctx context.Context) (*Grant, error) {
	return rw.lock(ctx, rw.wq, false, func(ctx context.Context) (int64, error) {
		return rw.wq.waitCount(ctx, &writeCounter{rw: rw})
	})
}

// TryLock takes the lock for writing only if no key exists under the name
// (no holder, no waiter), in one request, and returns an error wrapping
// holdfast.ErrLocked otherwise, having written nothing.
func (rw *RWMutex) TryLock(ctx context.Context) (*Grant, error) {
	return rw.lock(ctx, rw.wq, true, rw.tryWrite)
}

// RLock waits until the lock is granted for reading: once no writer that
// arrived earlier holds or waits. See Mutex.Lock for ctx and cleanup.
func (rw *RWMutex) RLock(ctx context.Context) (*Grant, error) {
	return rw.lock(ctx, rw.rq, false, func(ctx context.Context) (int64, error) {
		return rw.rq.waitCount(ctx, &readCounter{rw: rw})
	})
}

// TryRLock takes the lock for reading only if no writer holds or waits,
// and returns an error wrapping holdfast.ErrLocked otherwise, having written
// nothing. It costs two requests: a read, then a put that applies only if
// no write key appeared or changed since.
func (rw *RWMutex) TryRLock(ctx context.Context) (*Grant, error) {
	return rw.lock(ctx, rw.rq, true, rw.tryRead)
}

func (rw *RWMutex) lock(ctx context.Context, q queue, try bool, join joinFunc) (*Grant, error) {
	g, err := acquire(ctx, q, rw.name, try, nil, join)
	if err != nil {
		return nil, err
	}
	if q.key == rw.wq.key {
		g.rw = rw
	}
	return g, nil
}

// tryWrite puts the write key only if the prefix is empty.
func (rw *RWMutex) tryWrite(ctx context.Context) (int64, error) {
	q := rw.wq
	empty := clientv3.Compare(clientv3.CreateRevision(q.pfx), "=", 0).WithPrefix()
	put := clientv3.OpPut(q.key, "", clientv3.WithLease(q.s.lease))
	resp, err := q.s.client.Txn(ctx).If(empty).Then(put).Else(rw.kindOps()...).Commit()
	if err != nil {
		return unjoined(err), err
	}
	if !resp.Succeeded {
		if err := rw.foreign(resp.Responses); err != nil {
			return notJoined, err
		}
		return notJoined, fmt.Errorf("%w: %s", holdfast.ErrLocked, rw.name)
	}
	return resp.Header.Revision, nil
}

// tryRead reads what blocks a reader and puts the read key only if nothing
// does and no write key was created or changed since the read.
func (rw *RWMutex) tryRead(ctx context.Context) (int64, error) {
	q := rw.rq
	c := &readCounter{rw: rw}
	for {
		resp, err := q.s.client.Txn(ctx).Then(append(c.joinOps(), clientv3.OpGet(q.key, clientv3.WithKeysOnly()))...).Commit()
		if err != nil {
			return notJoined, err
		}
		n, err := c.joinCount(resp.Responses)
		if err != nil {
			return notJoined, err
		}
		if first(resp.Responses[len(resp.Responses)-1]) != nil {
			return notJoined, fmt.Errorf("%w: %s: this session's key is being removed", holdfast.ErrLocked, rw.name)
		}
		if n > 0 {
			return notJoined, fmt.Errorf("%w: %s has a writer", holdfast.ErrLocked, rw.name)
		}
		unchanged := clientv3.Compare(clientv3.ModRevision(q.pfx+"write/"), "<", resp.Header.Revision+1).WithPrefix()
		put := clientv3.OpPut(q.key, "", clientv3.WithLease(q.s.lease))
		tr, err := q.s.client.Txn(ctx).If(unchanged).Then(put).Commit()
		if err != nil {
			return unjoined(err), err // the put may have applied
		}
		if tr.Succeeded {
			return tr.Header.Revision, nil
		}
	}
}

// Downgrade turns w, a write grant of rw, into a read grant, without a
// moment when another writer, or a reader queued behind, could get in: see
// RWMutex. The read grant keeps w's key and token. w ends (its context is
// cancelled with holdfast.ErrReleased) before the downgrade is sent, since
// readers may come in as soon as it lands.
//
// If the downgrade fails, w has ended all the same: if etcd refused it
// because w was lost, the error wraps holdfast.ErrNotHeld; if its outcome is
// unknown (ctx ended, etcd unreachable), the session releases the lock in
// the background, as after a failed Lock.
func (rw *RWMutex) Downgrade(ctx context.Context, w *Grant) (*Grant, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if w == nil || w.rw != rw {
		return nil, fmt.Errorf("%w: Downgrade of a grant that is not a write grant of %s", holdfast.ErrInvalidArgument, rw.name)
	}
	s := rw.wq.s
	// End w without releasing its key; the read grant takes the key and
	// the session's slot of the name over.
	if !w.base.Handover() {
		return nil, w.base.NotHeld()
	}
	s.watcher.remove(w)
	ctx, stop := core.Bind(ctx, s.keeper.Context())
	defer stop()
	return rw.downgrade(ctx, w)
}

// downgradeInPlace is Downgrade's write: the marker names w's key, which
// stays as it is, in a transaction guarded by w's create revision.
func (rw *RWMutex) downgradeInPlace(ctx context.Context, w *Grant) (*Grant, error) {
	s := rw.wq.s
	value := w.Key() + " " + strconv.FormatInt(w.rev, 10)
	ops := append([]clientv3.Op{clientv3.OpPut(rw.marker, value, clientv3.WithLease(s.lease))}, touchWriteKey(w, s.lease)...)
	var resp *clientv3.TxnResponse
	err := core.Retry(ctx, func(actx context.Context) error {
		var err error
		resp, err = s.client.Txn(actx).If(w.Guard()).Then(ops...).Commit()
		return storeErr(err)
	})
	dropMarker := clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(rw.marker), "=", value)}, []clientv3.Op{clientv3.OpDelete(rw.marker)}, nil)
	switch {
	case err == nil && resp.Succeeded:
		g := newGrant(s, w.pfx, w.Key(), w.rev, w.rev, w.free, []clientv3.Op{dropMarker})
		g.base.Observed(rw.name, time.Now())
		return g, nil
	case err == nil:
		w.free()
		return nil, fmt.Errorf("%w: %s: %w: %s no longer has create revision %d", holdfast.ErrNotHeld, w.Key(), holdfast.ErrLost, w.Key(), w.rev)
	}
	// Unknown outcome: remove the key and the marker, if ours.
	release := func(ctx context.Context) error {
		_, err := s.client.Txn(ctx).If(w.Guard()).Then(clientv3.OpDelete(w.Key()), dropMarker).Else(dropMarker).Commit()
		return storeErr(err)
	}
	if !s.bg.Go(func(bctx context.Context) {
		_ = core.Retry(bctx, release)
		w.free()
	}) {
		w.free()
	}
	return nil, failed(ctx, s, rw.name, err)
}

// kindOps count the keys under the name by kind: all, readers', writers',
// and the marker; see foreign.
func (rw *RWMutex) kindOps() []clientv3.Op {
	pfx := rw.wq.pfx
	return []clientv3.Op{
		clientv3.OpGet(pfx, clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(pfx+"read/", clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(pfx+"write/", clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(rw.marker, clientv3.WithCountOnly()),
	}
}

// foreign returns an error wrapping holdfast.ErrConflict if the answers to
// kindOps count keys that are neither a reader's, nor a writer's, nor the
// marker: a Mutex's or a Semaphore's keys ("<name>/<lease hex>"), or a
// longer name's. A waiter counts every key ahead of it at its join, so the
// check at the join is enough.
func (rw *RWMutex) foreign(rs []*pb.ResponseOp) error {
	n := rs[0].GetResponseRange().Count
	for _, r := range rs[1:4] {
		n -= r.GetResponseRange().Count
	}
	if n > 0 {
		return fmt.Errorf("%w: read-write lock %s: %d keys under the name belong to a lock, a semaphore or a longer name: they may not share a name", holdfast.ErrConflict, rw.name, n)
	}
	return nil
}

// writeCounter counts, for a writer, every key created before its own.
type writeCounter struct{ rw *RWMutex }

func (c *writeCounter) limit() int { return 1 }

func (c *writeCounter) watchOpts() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithFilterPut()}
}

func (c *writeCounter) joinOps() []clientv3.Op { return c.rw.kindOps() }

func (c *writeCounter) joinCount(rs []*pb.ResponseOp) (int, error) {
	if err := c.rw.foreign(rs); err != nil {
		return 0, err
	}
	return int(rs[0].GetResponseRange().Count), nil
}

func (c *writeCounter) recountOps(rev int64) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(c.rw.wq.pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(rev-1))}
}

func (c *writeCounter) recount(rs []*pb.ResponseOp, _ int64) (int, error) {
	return len(rs[0].GetResponseRange().GetKvs()), nil
}

func (c *writeCounter) event(ev *clientv3.Event, rev int64) (int, bool) {
	return semCounter{}.event(ev, rev)
}

func (c *writeCounter) mismatch(*mvccpb.KeyValue) error { return nil }

// readCounter counts, for a reader, the write keys created before its own,
// but not a downgraded one (named by the marker).
type readCounter struct {
	rw *RWMutex
	// The downgraded write key, not counted (key and create revision).
	downKey string
	downRev int64
}

func (c *readCounter) limit() int { return 1 }

// watchOpts: a reader needs puts too (the marker's).
func (c *readCounter) watchOpts() []clientv3.OpOption { return nil }

// joinOps: kindOps, then the first write key and the marker.
func (c *readCounter) joinOps() []clientv3.Op {
	return append(c.rw.kindOps(),
		clientv3.OpGet(c.rw.rq.pfx+"write/", append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...),
		clientv3.OpGet(c.rw.marker))
}

func (c *readCounter) joinCount(rs []*pb.ResponseOp) (int, error) {
	if err := c.rw.foreign(rs); err != nil {
		return 0, err
	}
	n := int(rs[2].GetResponseRange().Count)
	var firstW []*mvccpb.KeyValue
	if kv := first(rs[4]); kv != nil {
		firstW = append(firstW, kv)
	}
	return n - c.discount(firstW, first(rs[5])), nil
}

func (c *readCounter) recountOps(rev int64) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpGet(c.rw.rq.pfx+"write/", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(rev-1)),
		clientv3.OpGet(c.rw.marker),
	}
}

func (c *readCounter) recount(rs []*pb.ResponseOp, _ int64) (int, error) {
	ws := rs[0].GetResponseRange().GetKvs()
	return len(ws) - c.discount(ws, first(rs[1])), nil
}

// discount returns 1 if the marker names one of ws (the write keys counted:
// the downgraded one is the first of them, the holder), and remembers it.
// A marker that names no live write key (left after its key was deleted) is
// ignored.
func (c *readCounter) discount(ws []*mvccpb.KeyValue, marker *mvccpb.KeyValue) int {
	c.downKey, c.downRev = "", 0
	if marker == nil {
		return 0
	}
	key, rev, ok := parseMarker(marker.Value)
	if !ok {
		return 0
	}
	for _, kv := range ws {
		if marks(kv, key, rev) {
			c.downKey, c.downRev = string(kv.Key), kv.CreateRevision
			return 1
		}
	}
	return 0
}

func (c *readCounter) event(ev *clientv3.Event, rev int64) (int, bool) {
	key := string(ev.Kv.Key)
	switch {
	case ev.Type == mvccpb.PUT && key == c.rw.marker:
		wkey, wrev, ok := parseMarker(ev.Kv.Value)
		if !ok || wrev >= rev || wkey == c.downKey && wrev == c.downRev {
			return 0, false
		}
		// The downgrade is guarded by its write key, so that key exists
		// now, and since it was created before ours, we counted it.
		c.downKey, c.downRev = wkey, wrev
		return 1, false
	case ev.Type == mvccpb.DELETE && strings.HasPrefix(key, c.rw.rq.pfx+"write/"):
		if ev.PrevKv == nil {
			return 0, true
		}
		if ev.PrevKv.CreateRevision >= rev || key == c.downKey && ev.PrevKv.CreateRevision == c.downRev {
			return 0, false // behind us, or not counted
		}
		return 1, false
	}
	return 0, false
}

func (c *readCounter) mismatch(*mvccpb.KeyValue) error { return nil }

// parseMarker reads the marker's value: "<write key> <create revision>".
func parseMarker(v []byte) (key string, rev int64, ok bool) {
	i := strings.LastIndexByte(string(v), ' ')
	if i < 0 {
		return "", 0, false
	}
	rev, err := strconv.ParseInt(string(v[i+1:]), 10, 64)
	return string(v[:i]), rev, err == nil
}
