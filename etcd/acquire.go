package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// joinFunc is the store half of one acquisition: a waiting algorithm
// (queue.waitTurn, queue.waitCount) or a TryLock's one-shot join. It
// returns the create revision of the key it holds, or an error and what it
// left in etcd: a revision, our key at that revision; 0, our key may or may
// not exist (a request whose outcome is unknown); notJoined, nothing.
type joinFunc func(ctx context.Context) (rev int64, err error)

// notJoined is the revision a join returns when it wrote nothing: the
// driver has nothing to clean up.
const notJoined = -1

// unjoined is the revision a join returns after its write request failed
// with err: notJoined if etcd refused the request, else 0 (it may have
// applied).
func unjoined(err error) int64 {
	if errors.Is(storeErr(err), holdfast.ErrPermissionDenied) {
		return notJoined
	}
	return 0
}

// acquire is the driver of every acquisition on etcd (Mutex, Semaphore,
// RWMutex, Election): it runs join for the key of q in the session's name
// slot of name and turns its answer into a Grant or an error. A nil
// reentry means the primitive is not reentrant. The steps are in
// docs/DESIGN.md ("etcd acquisition driver").
func acquire(ctx context.Context, q queue, name string, try bool, reentry *core.Reentry[*Grant], join joinFunc) (*Grant, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	s := q.s
	if err := s.alive(); err != nil {
		return nil, err
	}
	if reentry != nil { // 1. reentry
		if g, ok := reentry.Enter(); ok {
			return g, nil
		}
	}
	start := time.Now()
	defer s.keeper.Waiting(name)()
	ctx, stop := core.Bind(ctx, s.keeper.Context()) // 2. every wait ends with the session
	defer stop()
	free, err := s.slot(ctx, name, q.key, try) // 3. the session's slot of the name
	if err != nil {
		return nil, failed(ctx, s, name, err)
	}
	rev, err := join(ctx) // 4. the store
	if err == nil {
		err = s.alive() // never hand out a grant of a session already lost
	}
	if err != nil { // 5. clean up what the join left
		if rev == notJoined {
			free()
		} else {
			q.cleanup(max(rev, 0), free)
		}
		return nil, failed(ctx, s, name, err)
	}
	g := newGrant(s, q.pfx, q.key, rev, rev, free, nil) // 6. the grant
	g.base.Observed(name, start)
	if reentry != nil {
		reentry.Remember(g, g.base)
	}
	return g, nil
}

// slot takes the session's slot of name for the acquisition using key
// (TryLock: only if it is free, else an error wrapping holdfast.ErrLocked),
// and returns the function that frees it.
func (s *Session) slot(ctx context.Context, name, key string, try bool) (func(), error) {
	free, err := s.names.Slot(ctx, name, try)
	if err != nil {
		return nil, err
	}
	s.using.Store(name, key)
	return func() {
		s.using.CompareAndDelete(name, key)
		free()
	}, nil
}

// watchDelay is how long a grant is held before the session watches its key:
// short critical sections do not pay for creating and cancelling a watch.
const watchDelay = 20 * time.Millisecond

// newGrant returns the grant of key, at create revision rev, with token
// token, watched by the session from a moment after it is handed out. free
// (the session's slot of the name) is called once the grant has ended in
// the store; also runs with the release.
func newGrant(s *Session, pfx, key string, rev, token int64, free func(), also []clientv3.Op) *Grant {
	g := &Grant{s: s, pfx: pfx, rev: rev, from: rev + 1, free: free, also: also}
	g.base = core.NewGrant(s.keeper, s.bg, key, holdfast.Token(token), core.ReleaseFunc(g.release), func() {
		s.watcher.remove(g)
		g.free()
	})
	time.AfterFunc(watchDelay, func() { s.watcher.add(g) })
	return g
}

// failed is the error of a failed acquisition: the session's end if that
// is why (ErrSessionLost or ErrSessionClosed), else ctx's error if it ended,
// else the store's error.
func failed(ctx context.Context, s *Session, name string, err error) error {
	if serr := s.alive(); serr != nil {
		return fmt.Errorf("holdfast/etcd: lock %s: %w", name, serr)
	}
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("holdfast/etcd: lock %s: %w (%v)", name, ctx.Err(), err)
	}
	if errors.Is(storeErr(err), holdfast.ErrSessionLost) {
		s.keeper.End(fmt.Errorf("%w: lease %x not found", holdfast.ErrSessionLost, int64(s.lease)))
	}
	return fmt.Errorf("holdfast/etcd: lock %s: %w", name, storeErr(err))
}
