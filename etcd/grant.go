package etcd

import (
	"bytes"
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// Grant is a held etcd lock. It implements holdfast.Grant; its token is the
// create revision of its key, "<name>/<lease ID in hex>".
//
// While it is held, the session watches its key (on one watch stream shared
// by all the session's grants), so a revoked lease or a deleted key ends the
// grant within milliseconds.
type Grant struct {
	base *core.Grant // key, token, context, reentrancy, release
	s    *Session
	pfx  string // the lock's prefix, "<name>/": Txn may not touch it
	rev  int64  // create revision of the key

	// Semaphores and read-write locks (see newGrant and RWMutex.Downgrade).
	free func()        // frees the session's slot of the name, once the grant has ended
	also []clientv3.Op // run with the release, whether or not the key is still ours
	rw   *RWMutex      // the lock of a write grant, which may be downgraded

	// Owned by the session's watcher (under its mutex).
	watchID   int64
	from      int64 // revision to watch the key from
	unwatched bool  // the grant ended: never watch it again
}

var _ holdfast.Grant = (*Grant)(nil)

// Key implements holdfast.Grant: the holder's own key, "<name>/<lease ID in
// hex>", as in concurrency.Mutex.
func (g *Grant) Key() string { return g.base.Key() }

// Token implements holdfast.Grant: the create revision of Key.
func (g *Grant) Token() holdfast.Token { return g.base.Token() }

// Context implements holdfast.Grant.
func (g *Grant) Context() context.Context { return g.base.Context() }

// Deadline implements holdfast.Grant.
func (g *Grant) Deadline() time.Time { return g.base.Deadline() }

// Unlock implements holdfast.Grant. The release is one transaction that
// deletes Key only while it still has the grant's create revision, so it
// never removes a newer grant's key. ctx bounds only the wait for etcd's
// answer: if it ends first, Unlock returns an error wrapping ctx's error
// and the session goes on with the release in the background.
func (g *Grant) Unlock(ctx context.Context) error { return g.base.Unlock(ctx) }

// Guard returns the comparison that holds exactly while this grant does: its
// key still exists with its create revision. Put it in the If of your own
// transactions; Txn does it for you.
func (g *Grant) Guard() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(g.Key()), "=", g.rev)
}

// Txn runs ops in one etcd transaction that commits only while the grant is
// held (its If is Guard). If the grant was released or lost (locally or in
// etcd), it applies nothing and returns an error wrapping
// holdfast.ErrNotHeld.
//
// ops may not touch the lock's own keys (any key under "<name>/", the
// holder's key included, even in a nested transaction): a put on the
// holder's key would detach it from the session's lease. Such ops are
// refused, before any request, with an error wrapping
// holdfast.ErrInvalidArgument.
//
// ctx bounds the request; Txn never waits for anything else (an Unlock in
// progress, say).
func (g *Grant) Txn(ctx context.Context, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if err := g.checkOps(ops); err != nil {
		return nil, err
	}
	if !g.base.Held() {
		return nil, g.base.NotHeld()
	}
	resp, err := g.s.client.Txn(ctx).If(txnGuard(g)...).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("holdfast/etcd: guarded txn on %s: %w", g.Key(), storeErr(err))
	}
	if !resp.Succeeded {
		g.base.Lose(fmt.Errorf("%w: %s no longer has create revision %d", holdfast.ErrLost, g.Key(), g.rev))
		return nil, g.base.NotHeld()
	}
	return resp, nil
}

// checkOps refuses any op whose key range meets the lock's prefix.
func (g *Grant) checkOps(ops []clientv3.Op) error {
	for _, op := range ops {
		if op.IsTxn() {
			_, then, els := op.Txn()
			if err := g.checkOps(then); err != nil {
				return err
			}
			if err := g.checkOps(els); err != nil {
				return err
			}
			continue
		}
		if overlaps(op.KeyBytes(), op.RangeBytes(), []byte(g.pfx)) {
			return fmt.Errorf("%w: guarded txn op on %q touches the lock's own keys (%s*)", holdfast.ErrInvalidArgument, op.KeyBytes(), g.pfx)
		}
	}
	return nil
}

// overlaps reports whether etcd's key range [key, end) meets the keys that
// start with pfx. end nil is the single key; end "\x00" means every key from
// key on.
func overlaps(key, end, pfx []byte) bool {
	if len(end) == 0 {
		return bytes.HasPrefix(key, pfx)
	}
	pend := []byte(clientv3.GetPrefixRangeEnd(string(pfx)))
	unbounded := len(end) == 1 && end[0] == 0
	// [key, end) meets [pfx, pend) iff key < pend and pfx < end.
	return bytes.Compare(key, pend) < 0 && (unbounded || bytes.Compare(pfx, end) < 0)
}

// release is the guarded delete behind Unlock (one attempt; the core
// retries it).
func (g *Grant) release(ctx context.Context) error {
	resp, err := g.s.client.Txn(ctx).If(releaseGuard(g)...).Then(append([]clientv3.Op{clientv3.OpDelete(g.Key())}, g.also...)...).Else(g.also...).Commit()
	if err != nil {
		return storeErr(err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s no longer has create revision %d", holdfast.ErrNotHeld, g.Key(), g.rev)
	}
	return nil
}
