package conformance_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/conformance"
	"github.com/holdfast/holdfast/internal/options"
)

// This file is an in-memory, in-process lock store with etcd's key layout
// (<name>/<session>), used only to test the suite itself. With no bug set it
// implements the holdfast contract; each bug below breaks one property the
// way real lock recipes have broken it.

// Bugs a fake store can be built with.
const (
	bugLIFO              = "lifo"                  // the newest waiter is granted next, not the oldest
	bugNoExclusion       = "no-exclusion"          // two holders at once
	bugSessionToken      = "session-token"         // token counts the session's own grants: increases per client only
	bugTryLockBlocks     = "trylock-blocks"        // TryLock waits like Lock
	bugLeakyCancel       = "leaky-cancel"          // a waiter whose ctx ends leaves its key behind
	bugReleaseCause      = "release-cause-missing" // Unlock cancels the grant context without ErrReleased
	bugNoLossNotice      = "no-loss-notice"        // a grant's context ignores the death of its session
	bugUnguardedUnlock   = "unguarded-unlock"      // Unlock deletes whoever holds the lock now, and never fails
	bugReentrantIgnored  = "reentrant-ignored"     // WithReentrant has no effect
	bugWaiterIgnoresKill = "waiter-ignores-kill"   // a waiter keeps waiting after its session died
	bugUnlockCancelDrops = "unlock-cancel-drops"   // Unlock with a done ctx forgets the grant but leaves its key
	bugLeakGoroutine     = "leak-goroutine"        // every grant starts a watcher goroutine that never ends
)

// fakeStore is the store: keys, a revision counter and change notification.
type fakeStore struct {
	bug string

	mu      sync.Mutex
	rev     uint64
	nsess   int
	keys    map[string]*fakeEntry
	changed chan struct{} // closed and replaced on every change
}

// fakeEntry is a key: a waiter until it is given a token, the holder after.
type fakeEntry struct {
	name  string
	sess  *fakeSession
	seq   uint64         // revision that created the key
	token holdfast.Token // non-zero once the key holds the lock
}

type fakeSession struct {
	st       *fakeStore
	id       string
	ctx      context.Context
	end      context.CancelCauseFunc
	acquired uint64 // grants so far (bugSessionToken)
}

func newFakeStore(bug string) *fakeStore {
	return &fakeStore{bug: bug, keys: make(map[string]*fakeEntry), changed: make(chan struct{})}
}

// backend returns the conformance description of the store.
func (st *fakeStore) backend() conformance.Backend {
	return conformance.Backend{
		NewLocker: func(t *testing.T, name string, opts ...holdfast.LockOption) (holdfast.Locker, func()) {
			t.Helper()
			if err := holdfast.ValidateName(name); err != nil {
				t.Fatalf("fake: %v", err)
			}
			s := st.newSession()
			t.Cleanup(func() { st.endSession(s, holdfast.ErrSessionClosed) })
			l := &fakeLocker{
				st:        st,
				sess:      s,
				name:      name,
				key:       name + "/" + s.id,
				reentrant: options.ApplyLock(opts).Reentrant && st.bug != bugReentrantIgnored,
				slot:      make(chan struct{}, 1),
			}
			kill := func() { st.endSession(s, fmt.Errorf("%w: session %s killed", holdfast.ErrSessionLost, s.id)) }
			return l, kill
		},
		Keys: func(t *testing.T, name string) []string {
			st.mu.Lock()
			defer st.mu.Unlock()
			var ks []string
			for k := range st.keys {
				if strings.HasPrefix(k, name+"/") {
					ks = append(ks, k)
				}
			}
			slices.Sort(ks)
			return ks
		},
		LossNotice: lossNotice,
		OpTimeout:  opTimeout,
	}
}

func (st *fakeStore) newSession() *fakeSession {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.nsess++
	s := &fakeSession{st: st, id: fmt.Sprintf("%x", 0x1000+st.nsess)}
	s.ctx, s.end = context.WithCancelCause(context.Background())
	return s
}

// endSession ends s with cause: its grants' contexts first, then its keys.
func (st *fakeStore) endSession(s *fakeSession, cause error) {
	s.end(cause)
	st.mu.Lock()
	defer st.mu.Unlock()
	names := map[string]bool{}
	for k, e := range st.keys {
		if e.sess == s {
			delete(st.keys, k)
			names[e.name] = true
		}
	}
	for name := range names {
		st.promoteLocked(name)
	}
	st.notifyLocked()
}

func (st *fakeStore) notifyLocked() {
	close(st.changed)
	st.changed = make(chan struct{})
}

// promoteLocked gives the lock to waiters while there is room.
func (st *fakeStore) promoteLocked(name string) {
	limit := 1
	if st.bug == bugNoExclusion {
		limit = 2
	}
	held := 0
	var waiting []*fakeEntry
	for _, e := range st.keys {
		switch {
		case e.name != name:
		case e.token != 0:
			held++
		default:
			waiting = append(waiting, e)
		}
	}
	sort.Slice(waiting, func(i, j int) bool { return waiting[i].seq < waiting[j].seq })
	if st.bug == bugLIFO {
		slices.Reverse(waiting)
	}
	for ; held < limit && len(waiting) > 0; held++ {
		e := waiting[0]
		waiting = waiting[1:]
		st.rev++
		e.token = holdfast.Token(st.rev)
		if st.bug == bugSessionToken {
			e.sess.acquired++
			e.token = holdfast.Token(e.sess.acquired)
		}
	}
}

// deleteLocked removes key if it is still e (a guarded delete).
func (st *fakeStore) deleteLocked(key string, e *fakeEntry) bool {
	if st.keys[key] != e {
		return false
	}
	delete(st.keys, key)
	st.promoteLocked(e.name)
	st.notifyLocked()
	return true
}

// fakeLocker is one name on one session.
type fakeLocker struct {
	st        *fakeStore
	sess      *fakeSession
	name, key string
	reentrant bool
	slot      chan struct{} // one acquisition of the name per session at a time

	mu  sync.Mutex
	cur *fakeGrant
}

func (l *fakeLocker) Lock(ctx context.Context) (holdfast.Grant, error) {
	return l.acquire(ctx, false)
}

func (l *fakeLocker) TryLock(ctx context.Context) (holdfast.Grant, error) {
	return l.acquire(ctx, l.st.bug != bugTryLockBlocks)
}

func (l *fakeLocker) acquire(ctx context.Context, try bool) (holdfast.Grant, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fake: lock %s: %w", l.name, err)
	}
	if err := l.sess.ctx.Err(); err != nil {
		return nil, fmt.Errorf("fake: lock %s: %w", l.name, context.Cause(l.sess.ctx))
	}
	if l.reentrant {
		l.mu.Lock()
		g := l.cur
		l.mu.Unlock()
		if g != nil && g.reenter() {
			return g, nil
		}
	}
	if try {
		select {
		case l.slot <- struct{}{}:
		default:
			return nil, fmt.Errorf("fake: lock %s: %w", l.name, holdfast.ErrLocked)
		}
	} else {
		select {
		case l.slot <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("fake: lock %s: %w", l.name, ctx.Err())
		case <-l.sess.ctx.Done():
			return nil, fmt.Errorf("fake: lock %s: %w", l.name, context.Cause(l.sess.ctx))
		}
	}
	g, err := l.acquireStore(ctx, try)
	if err != nil {
		<-l.slot
		return nil, err
	}
	l.mu.Lock()
	l.cur = g
	l.mu.Unlock()
	return g, nil
}

func (l *fakeLocker) acquireStore(ctx context.Context, try bool) (*fakeGrant, error) {
	st := l.st
	sessDone := l.sess.ctx.Done()
	if st.bug == bugWaiterIgnoresKill {
		sessDone = nil
	}
	st.mu.Lock()
	if err := l.sess.ctx.Err(); err != nil {
		st.mu.Unlock()
		return nil, fmt.Errorf("fake: lock %s: %w", l.name, context.Cause(l.sess.ctx))
	}
	if try {
		for _, e := range st.keys {
			if e.name == l.name {
				st.mu.Unlock()
				return nil, fmt.Errorf("fake: lock %s: %w", l.name, holdfast.ErrLocked)
			}
		}
	}
	st.rev++
	e := &fakeEntry{name: l.name, sess: l.sess, seq: st.rev}
	st.keys[l.key] = e
	st.promoteLocked(l.name)
	st.notifyLocked()
	for {
		if e.token != 0 {
			st.mu.Unlock()
			return l.newGrant(e), nil
		}
		changed := st.changed
		st.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			if st.bug != bugLeakyCancel {
				st.mu.Lock()
				st.deleteLocked(l.key, e)
				st.mu.Unlock()
			}
			return nil, fmt.Errorf("fake: lock %s: %w", l.name, ctx.Err())
		case <-sessDone:
			st.mu.Lock()
			st.deleteLocked(l.key, e)
			st.mu.Unlock()
			return nil, fmt.Errorf("fake: lock %s: %w", l.name, context.Cause(l.sess.ctx))
		}
		st.mu.Lock()
	}
}

// fakeGrant is a held lock.
type fakeGrant struct {
	l      *fakeLocker
	e      *fakeEntry
	token  holdfast.Token
	ctx    context.Context
	cancel context.CancelCauseFunc
	once   sync.Once

	mu    sync.Mutex
	count int
}

func (l *fakeLocker) newGrant(e *fakeEntry) *fakeGrant {
	parent := l.sess.ctx
	if l.st.bug == bugNoLossNotice {
		parent = context.Background()
	}
	g := &fakeGrant{l: l, e: e, token: e.token, count: 1}
	g.ctx, g.cancel = context.WithCancelCause(parent)
	context.AfterFunc(g.ctx, g.end)
	if l.st.bug == bugLeakGoroutine {
		go g.watch(make(chan struct{}))
	}
	return g
}

// watch stands for a watcher goroutine that its grant forgets to stop.
func (g *fakeGrant) watch(stop chan struct{}) { <-stop }

// end frees the locker's slot once the grant is released or lost.
func (g *fakeGrant) end() {
	g.once.Do(func() {
		g.l.mu.Lock()
		if g.l.cur == g {
			g.l.cur = nil
		}
		g.l.mu.Unlock()
		<-g.l.slot
	})
}

func (g *fakeGrant) reenter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.count == 0 || g.ctx.Err() != nil {
		return false
	}
	g.count++
	return true
}

func (g *fakeGrant) Key() string              { return g.l.key }
func (g *fakeGrant) Token() holdfast.Token    { return g.token }
func (g *fakeGrant) Context() context.Context { return g.ctx }
func (g *fakeGrant) Deadline() time.Time      { return time.Now().Add(time.Hour) }

func (g *fakeGrant) Unlock(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	st := g.l.st
	g.mu.Lock()
	defer g.mu.Unlock()
	if st.bug == bugUnguardedUnlock {
		st.mu.Lock()
		var holders []string
		for k, e := range st.keys {
			if e.name == g.l.name && e.token != 0 {
				holders = append(holders, k)
			}
		}
		for _, k := range holders {
			st.deleteLocked(k, st.keys[k])
		}
		st.mu.Unlock()
		g.count = 0
		g.cancel(holdfast.ErrReleased)
		g.end()
		return nil
	}
	switch {
	case g.count == 0:
		return fmt.Errorf("%w: %s already released", holdfast.ErrNotHeld, g.l.key)
	case g.count > 1:
		g.count--
		return nil
	}
	if err := ctx.Err(); err != nil {
		if st.bug == bugUnlockCancelDrops {
			g.count = 0
			g.end()
		}
		return fmt.Errorf("fake: unlock %s: %w", g.l.key, err)
	}
	lost := g.ctx.Err() != nil
	st.mu.Lock()
	ok := st.deleteLocked(g.l.key, g.e)
	st.mu.Unlock()
	g.count = 0
	defer g.end()
	switch {
	case lost:
		return fmt.Errorf("%w: %s: %w", holdfast.ErrNotHeld, g.l.key, context.Cause(g.ctx))
	case !ok:
		g.cancel(fmt.Errorf("%w: %s removed from outside", holdfast.ErrLost, g.l.key))
		return fmt.Errorf("%w: %s", holdfast.ErrNotHeld, g.l.key)
	case st.bug == bugReleaseCause:
		g.cancel(nil)
	default:
		g.cancel(holdfast.ErrReleased)
	}
	return nil
}
