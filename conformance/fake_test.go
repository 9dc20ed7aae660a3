package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/conformance"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
	"github.com/holdfast/holdfast/leader"
)

// This file is an in-memory, in-process lock store with etcd's key layout
// (<name>/<session>) and a model of the network and of session expiry, used
// only to test the suite itself. With no bug set it implements the holdfast
// contract; each bug below breaks one property the way real lock recipes
// have broken it.

// Bugs a fake store can be built with.
const (
	bugLIFO                 = "lifo"                    // the newest waiter is granted next, not the oldest
	bugNoExclusion          = "no-exclusion"            // two holders at once
	bugSessionToken         = "session-token"           // token counts the session's own grants: increases per client only
	bugZeroToken            = "zero-token"              // every token is 0
	bugKeyOutside           = "key-outside"             // Grant.Key is not under the lock name
	bugTryLockBlocks        = "trylock-blocks"          // TryLock waits like Lock
	bugTryLockBarges        = "trylock-barges"          // TryLock takes a lock nobody holds although a waiter is next in line
	bugLeakyCancel          = "leaky-cancel"            // a waiter whose ctx ends leaves its key behind
	bugCancelledFreeLock    = "cancelled-free-lock"     // Lock with a done ctx takes a free lock
	bugReleaseCause         = "release-cause-missing"   // Unlock cancels the grant context without ErrReleased
	bugNoLossNotice         = "no-loss-notice"          // a grant's context ignores the death of its session
	bugLossCausePlain       = "loss-cause-plain"        // a lost session's cause does not wrap ErrLost
	bugLateNotice           = "late-notice"             // a cut-off holder is told 50 ms after the store expired its session
	bugNoMargin             = "no-margin"               // the safe deadline has no margin: told when the store expires
	bugUnguardedUnlock      = "unguarded-unlock"        // Unlock deletes whoever holds the lock now, and never fails
	bugLossCleanupUnguarded = "loss-cleanup-unguarded"  // after a loss, the cleanup deletes whoever holds the lock now
	bugStaleUnlockByName    = "stale-unlock-by-name"    // a stale Unlock deletes the session's key by name, whatever grant it is now
	bugReentrantIgnored     = "reentrant-ignored"       // WithReentrant has no effect
	bugWaiterIgnoresKill    = "waiter-ignores-kill"     // a waiter keeps waiting after its session died
	bugGrantFromDeadSession = "grant-from-dead-session" // a locker whose session is gone still hands out grants
	bugCloseCause           = "close-cause"             // Close ends grants with ErrSessionLost, not ErrSessionClosed
	bugCtxBeforeSession     = "ctx-before-session"      // a Lock with a done ctx on an ended session reports the ctx, not the session
	bugLockIgnoresCtx       = "lock-ignores-ctx"        // a Lock waiting for a frozen store ignores its ctx
	bugUnlockWaitsForStore  = "unlock-waits-for-store"  // Unlock waits for the store, whatever its ctx
	bugUnlockCancelLeaves   = "unlock-cancel-leaves"    // Unlock with a done ctx ends the grant but never removes its key
	bugNestedIgnored        = "nested-ignored"          // a lock ignores keys of a longer name under it
	bugNilContext           = "nil-context"             // a nil context is not reported as ErrInvalidArgument
	bugHerd                 = "herd"                    // every waiter re-reads the queue on every change
	bugLeakGoroutine        = "leak-goroutine"          // every grant starts a watcher goroutine that never ends

	bugSemOverAdmit        = "sem-over-admission"      // a semaphore admits limit+1 holders
	bugSemMismatchIgnored  = "sem-mismatch-ignored"    // clients that disagree on the limit each use their own
	bugSemDeadHolderKept   = "sem-dead-holder-kept"    // a killed session's permit is never given back
	bugRWWriterBesideRead  = "rw-writer-beside-reader" // a writer is admitted while readers hold
	bugLateAdmission       = "late-admission"          // a permit (or read grant) asked for while one is held waits for a release, though it fits
	bugDowngradeNewToken   = "downgrade-new-token"     // Downgrade's read grant has a new token, not the write grant's
	bugDowngradeKeepsWrite = "downgrade-keeps-write"   // a Downgrade that fails leaves the write grant held
	bugRWReaderBarges      = "rw-reader-barges"        // a reader passes a queued writer while readers hold
	bugRWReadersExclusive  = "rw-readers-exclusive"    // readers do not share
	bugRWReentrantAccepted = "rw-reentrant-accepted"   // a read-write lock made with WithReentrant is made (and reentrant)
	bugElectTwoLeaders     = "election-two-leaders"    // two candidates lead at once
	bugElectTermsDecrease  = "election-terms-decrease" // each term is lower than the last
	bugElectToldLate       = "election-told-late"      // a resigning leader's context ends after its key is gone
	bugLeaderNoError       = "leader-no-error"         // Leader returns the zero Leader and nil when nobody leads
	bugObserveOutOfOrder   = "observe-out-of-order"    // Observe delivers pending changes newest first
	bugObserveSkips        = "observe-skips"           // Observe skips to the latest state (but the backend says ObserveAll)
	bugObserveNoNone       = "observe-no-none"         // Observe never delivers "no leader"
	bugObserveGhost        = "observe-ghost"           // Observe reports whichever key is first, even a candidate that gave up (its key is removed 500 ms late)
)

// fakeKind is the primitive a key belongs to.
type fakeKind int

const (
	kindLock fakeKind = iota
	kindSem
	kindRead
	kindWrite
	kindElect
)

const (
	fakeTTL    = time.Second
	fakeMargin = 200 * time.Millisecond
)

// fakeStore is the store: keys, a revision counter and change notification.
type fakeStore struct {
	bug string

	mu      sync.Mutex
	rev     uint64
	nsess   int
	keys    map[string]*fakeEntry
	changed chan struct{} // closed and replaced on every change
	// leaders is each election's history: every leader, and "no leader"
	// after a leader's key went, in order.
	leaders map[string][]holdfast.Leader
}

// fakeEntry is a key: a waiter until it is given a token, the holder after.
type fakeEntry struct {
	key   string
	kind  fakeKind
	limit int    // a semaphore's limit
	value []byte // a candidate's value
	name  string
	sess  *fakeSession
	seq   uint64         // revision that created the key
	held  bool           // the key holds the lock
	late  bool           // bugLateAdmission: joined while a permit was held; waits for a release
	token holdfast.Token // its fencing token, once held
	lost  func()         // tells the holder its key was deleted

	gaveUp, ghost bool // bugObserveGhost: a candidate that gave up, reported as leader
}

func newFakeStore(bug string) *fakeStore {
	return &fakeStore{bug: bug, keys: make(map[string]*fakeEntry), changed: make(chan struct{}), leaders: make(map[string][]holdfast.Leader)}
}

// backend returns the conformance description of the store.
func (st *fakeStore) backend() conformance.Backend {
	return conformance.Backend{
		NewLocker: func(t *testing.T, name string, opts ...holdfast.LockOption) (holdfast.Locker, conformance.Faults) {
			t.Helper()
			return st.newLocker(t, name, kindLock, 0, opts)
		},
		NewSemaphore: func(t *testing.T, name string, limit int, opts ...holdfast.LockOption) (holdfast.Locker, conformance.Faults) {
			t.Helper()
			return st.newLocker(t, name, kindSem, limit, opts)
		},
		NewRWMutex: func(t *testing.T, name string) (conformance.RWLocker, conformance.Faults) {
			t.Helper()
			l, f := st.newLocker(t, name, kindWrite, 0, nil)
			return fakeRW{l}, f
		},
		TryNewRWMutex: func(t *testing.T, name string, opts ...holdfast.LockOption) (conformance.RWLocker, error) {
			t.Helper()
			if options.ApplyLock(opts).Reentrant && st.bug != bugRWReentrantAccepted {
				return nil, fmt.Errorf("%w: a read-write lock is not reentrant", holdfast.ErrInvalidArgument)
			}
			l, _ := st.newLocker(t, name, kindWrite, 0, opts)
			return fakeRW{l}, nil
		},
		NewElection: func(t *testing.T, name string) (leader.Candidate[holdfast.Grant], conformance.Faults) {
			t.Helper()
			l, f := st.newLocker(t, name, kindElect, 0, nil)
			return fakeElection{l}, f
		},
		ObserveAll:     true,
		NewClaimer:     st.newClaimer,
		NewMultiLocker: st.newMultiLocker,
		ClaimFree:      time.Second,
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
		Delete: func(t *testing.T, key string) {
			st.mu.Lock()
			e := st.keys[key]
			st.mu.Unlock()
			if e != nil {
				st.delete(key, e)
			}
		},
		TTL:        fakeTTL,
		Margin:     fakeMargin,
		LossNotice: lossNotice,
		OpTimeout:  opTimeout,
	}
}

// newLocker returns a locker of kind for name on a new session, and its
// faults.
func (st *fakeStore) newLocker(t *testing.T, name string, kind fakeKind, limit int, opts []holdfast.LockOption) (*fakeLocker, conformance.Faults) {
	t.Helper()
	if err := holdfast.ValidateName(name); err != nil {
		t.Fatalf("fake: %v", err)
	}
	s := st.newSession()
	t.Cleanup(s.close)
	l := &fakeLocker{
		st:        st,
		sess:      s,
		name:      name,
		key:       name + "/" + s.id,
		kind:      kind,
		limit:     limit,
		reentrant: options.ApplyLock(opts).Reentrant && st.bug != bugReentrantIgnored,
		slot:      make(chan struct{}, 1),
	}
	return l, conformance.Faults{
		Kill: func() {
			cause := fmt.Errorf("%w: session %s killed", holdfast.ErrSessionLost, s.id)
			if st.bug == bugLossCausePlain {
				cause = fmt.Errorf("session %s killed", s.id)
			}
			s.keeper.End(cause)
			st.endSession(s)
		},
		Cut:      func() { s.setNet(netDown) },
		Freeze:   func() { s.setNet(netDown) },
		Mend:     func() { s.setNet(netUp) },
		Close:    s.close,
		Requests: s.requests.Load,
	}
}

// delete removes key if it is still e (a guarded delete), and tells its
// holder.
func (st *fakeStore) delete(key string, e *fakeEntry) bool {
	st.mu.Lock()
	ok := st.keys[key] == e
	if ok {
		delete(st.keys, key)
		st.removedLocked(e)
		st.notifyLocked()
	}
	st.mu.Unlock()
	if ok && e.lost != nil {
		e.lost()
	}
	return ok
}

// deleteHolders removes the keys that hold name now, whoever they are.
func (st *fakeStore) deleteHolders(name string) {
	st.mu.Lock()
	var hs []string
	for k, e := range st.keys {
		if e.name == name && e.held {
			hs = append(hs, k)
		}
	}
	st.mu.Unlock()
	for _, k := range hs {
		st.mu.Lock()
		e := st.keys[k]
		st.mu.Unlock()
		if e != nil {
			st.delete(k, e)
		}
	}
}

func (st *fakeStore) notifyLocked() {
	close(st.changed)
	st.changed = make(chan struct{})
}

// endSession is the store's end of s: its keys go.
func (st *fakeStore) endSession(s *fakeSession) {
	st.mu.Lock()
	s.dead = true
	if s.expiry != nil {
		s.expiry.Stop()
	}
	var mine []string
	for k, e := range st.keys {
		if e.sess == s {
			mine = append(mine, k)
		}
	}
	for _, k := range mine {
		e := st.keys[k]
		if st.bug == bugSemDeadHolderKept && e.kind == kindSem && e.held {
			continue // the permit stays taken
		}
		delete(st.keys, k)
		st.removedLocked(e)
	}
	st.notifyLocked()
	st.mu.Unlock()
}

// queueLocked returns the entries of name: holders, and waiters in order.
func (st *fakeStore) queueLocked(name string) (holders int, waiting []*fakeEntry) {
	for _, e := range st.keys {
		switch {
		case e.name != name:
		case e.held:
			holders++
		default:
			waiting = append(waiting, e)
		}
	}
	slices.SortFunc(waiting, func(a, b *fakeEntry) int { return int(a.seq) - int(b.seq) })
	if st.bug == bugLIFO {
		slices.Reverse(waiting)
	}
	return holders, waiting
}

// takeLocked gives e the lock if it is its turn.
func (st *fakeStore) takeLocked(e *fakeEntry) bool {
	if !st.admitLocked(e) {
		return false
	}
	st.rev++
	e.held, e.token = true, holdfast.Token(st.rev)
	switch st.bug {
	case bugSessionToken:
		e.sess.acquired++
		e.token = holdfast.Token(e.sess.acquired)
	case bugZeroToken:
		e.token = 0
	case bugElectTermsDecrease:
		if e.kind == kindElect {
			e.token = holdfast.Token(1<<40 - st.rev)
		}
	}
	if e.kind == kindElect {
		st.leaders[e.name] = append(st.leaders[e.name], holdfast.Leader{Key: e.key, Value: e.value, Term: e.token})
	}
	return true
}

// admitLocked reports whether e may hold now: a lock's (or an election's)
// first waiter when nobody holds; a semaphore's contender with fewer than
// its limit of keys before it; a writer with no key before it; a reader
// with no writer's key before it.
func (st *fakeStore) admitLocked(e *fakeEntry) bool {
	if e.kind == kindLock || e.kind == kindElect {
		limit := 1
		if st.bug == bugNoExclusion || (st.bug == bugElectTwoLeaders && e.kind == kindElect) {
			limit = 2
		}
		holders, waiting := st.queueLocked(e.name)
		return holders < limit && slices.Contains(waiting[:min(len(waiting), limit-holders)], e)
	}
	if e.late {
		return false
	}
	var before, writers, heldWriters int
	for _, o := range st.keys {
		if o.name != e.name || o.seq >= e.seq {
			continue
		}
		before++
		if o.kind == kindWrite {
			writers++
			if o.held {
				heldWriters++
			}
		}
	}
	switch e.kind {
	case kindSem:
		limit := e.limit
		if st.bug == bugSemOverAdmit {
			limit++
		}
		return before < limit
	case kindWrite:
		if st.bug == bugRWWriterBesideRead {
			return writers == 0
		}
		return before == 0
	default: // kindRead
		switch st.bug {
		case bugRWReaderBarges:
			return heldWriters == 0
		case bugRWReadersExclusive:
			return before == 0
		}
		return writers == 0
	}
}

// removedLocked records that e's key is gone: an election's leader's key
// leaves the election without a leader until the next one takes over.
func (st *fakeStore) removedLocked(e *fakeEntry) {
	for _, o := range st.keys {
		if o.name == e.name {
			o.late = false
		}
	}
	if e.kind == kindElect && (e.held || e.ghost) {
		st.leaders[e.name] = append(st.leaders[e.name], holdfast.Leader{})
	}
	if st.bug == bugObserveGhost && e.kind == kindElect && e.held {
		if _, waiting := st.queueLocked(e.name); len(waiting) > 0 && waiting[0].gaveUp {
			w := waiting[0]
			w.ghost = true
			st.leaders[e.name] = append(st.leaders[e.name], holdfast.Leader{Key: w.key, Value: w.value, Term: holdfast.Token(w.seq)})
		}
	}
}

// leaderLocked is the current state of the election name.
func (st *fakeStore) leaderLocked(name string) holdfast.Leader {
	if h := st.leaders[name]; len(h) > 0 {
		return h[len(h)-1]
	}
	return holdfast.Leader{}
}

// predecessorLocked is the waiter just ahead of e, or a holder.
func (st *fakeStore) predecessorLocked(e *fakeEntry) *fakeEntry {
	var p *fakeEntry
	for _, o := range st.keys {
		if o.name == e.name && o.seq < e.seq && (p == nil || o.seq > p.seq) {
			p = o
		}
	}
	return p
}

// fakeSession is one client's session: its keeper (the client's view), the
// store's expiry, and the network between them.
type fakeSession struct {
	st        *fakeStore
	id        string
	keeper    *core.Keeper
	ctx       context.Context
	requests  atomic.Int64
	lastRenew atomic.Int64 // UnixNano of the last renewal
	acquired  uint64       // grants so far (bugSessionToken)

	netMu sync.Mutex
	up    bool
	netCh chan struct{} // closed and replaced when the network changes

	// the store's side, under st.mu
	dead   bool
	expiry *time.Timer

	stop      context.CancelFunc
	renewDone chan struct{}
	closeOnce sync.Once
	bg        *core.Background // background releases
}

const (
	netUp   = true
	netDown = false
)

func (st *fakeStore) newSession() *fakeSession {
	st.mu.Lock()
	st.nsess++
	s := &fakeSession{st: st, id: fmt.Sprintf("%x", 0x1000+st.nsess), up: true, netCh: make(chan struct{}), renewDone: make(chan struct{})}
	st.mu.Unlock()
	margin := fakeMargin
	ttl := fakeTTL
	switch st.bug {
	case bugNoMargin:
		margin = 0
	case bugLateNotice:
		ttl = time.Hour // the client never counts: the store tells it, late
	}
	s.bg = core.NewBackground(context.Background())
	s.lastRenew.Store(time.Now().UnixNano())
	s.keeper = core.NewKeeper(time.Now(), ttl, margin)
	s.ctx = s.keeper.Context()
	if st.bug == bugNoLossNotice {
		s.ctx = context.Background()
	}
	st.mu.Lock()
	s.expiry = time.AfterFunc(fakeTTL, s.expire)
	st.mu.Unlock()
	rctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	go s.renew(rctx, ttl, margin)
	return s
}

// renew renews the session every TTL/5 while the network is up, so that a
// renewal late by up to 600 ms (a stall of a loaded 2-core machine under
// -race) still comes before the deadline, TTL - margin after the last. (At
// TTL/3, a renewal more than 467 ms late missed it: TestFake's
// MultiNoDeadlock once lost a session so on this machine under load.)
func (s *fakeSession) renew(ctx context.Context, ttl, margin time.Duration) {
	defer close(s.renewDone)
	t := time.NewTicker(fakeTTL / 5)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.keeper.Context().Done():
			return
		case <-t.C:
		}
		if !s.isUp() {
			continue
		}
		now := time.Now()
		s.st.mu.Lock()
		alive := !s.dead
		if alive {
			s.expiry.Reset(fakeTTL)
		}
		s.st.mu.Unlock()
		if alive {
			s.lastRenew.Store(now.UnixNano())
			s.keeper.Renewed(now, ttl, margin)
		}
	}
}

// deadline is the safe deadline the session reports: the keeper's, or for
// bugLateNotice (whose keeper never counts) what it would have been.
func (s *fakeSession) deadline() time.Time {
	if s.st.bug == bugLateNotice {
		return time.Unix(0, s.lastRenew.Load()).Add(fakeTTL - fakeMargin)
	}
	return s.keeper.Deadline()
}

// expire is the store expiring the session: no renewal for a TTL.
func (s *fakeSession) expire() {
	s.st.endSession(s)
	cause := fmt.Errorf("%w: session %s expired", holdfast.ErrSessionLost, s.id)
	if s.st.bug == bugLateNotice {
		time.AfterFunc(50*time.Millisecond, func() { s.keeper.End(cause) })
		return
	}
	s.keeper.End(cause)
}

func (s *fakeSession) close() {
	s.closeOnce.Do(func() {
		cause := fmt.Errorf("%w: %w", holdfast.ErrLost, holdfast.ErrSessionClosed)
		if s.st.bug == bugCloseCause {
			cause = holdfast.ErrSessionLost
		}
		s.keeper.End(cause)
		s.stop()
		<-s.renewDone
		s.setNet(netUp)
		s.bg.Wait()
		s.st.endSession(s)
	})
}

func (s *fakeSession) isUp() bool {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	return s.up
}

func (s *fakeSession) setNet(up bool) {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	s.up = up
	close(s.netCh)
	s.netCh = make(chan struct{})
}

// call is one request to the store: it waits for the network, ctx (unless
// ignoreCtx) or the session's end.
func (s *fakeSession) call(ctx context.Context, ignoreCtx bool) error {
	s.requests.Add(1)
	return s.waitNet(ctx, ignoreCtx)
}

func (s *fakeSession) waitNet(ctx context.Context, ignoreCtx bool) error {
	done := ctx.Done()
	if ignoreCtx {
		done = nil
	}
	for {
		s.netMu.Lock()
		up, ch := s.up, s.netCh
		s.netMu.Unlock()
		if up {
			return nil
		}
		select {
		case <-ch:
		case <-done:
			return ctx.Err()
		case <-s.ctx.Done():
			return context.Cause(s.ctx)
		}
	}
}

// background runs f while the session lives, so that close waits for it
// (after close, f runs at once: the store has let go of everything).
func (s *fakeSession) background(f func()) {
	if !s.bg.Go(func(context.Context) { f() }) {
		f()
	}
}

// fakeLocker is one name on one session.
type fakeLocker struct {
	st        *fakeStore
	sess      *fakeSession
	name, key string
	kind      fakeKind // of Lock and TryLock: kindLock, kindSem, kindWrite
	limit     int      // a semaphore's
	reentrant bool
	slot      chan struct{} // one grant or acquisition of the name per session at a time

	mu  sync.Mutex
	cur *fakeGrant
}

func (l *fakeLocker) Lock(ctx context.Context) (holdfast.Grant, error) {
	return l.acquire(ctx, false, l.kind, nil)
}

func (l *fakeLocker) TryLock(ctx context.Context) (holdfast.Grant, error) {
	return l.acquire(ctx, l.st.bug != bugTryLockBlocks, l.kind, nil)
}

func (l *fakeLocker) acquire(ctx context.Context, try bool, kind fakeKind, value []byte) (holdfast.Grant, error) {
	st, s := l.st, l.sess
	if ctx == nil {
		if st.bug == bugNilContext {
			return nil, errors.New("fake: nil context")
		}
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil && st.bug == bugCtxBeforeSession {
		return nil, fmt.Errorf("fake: lock %s: %w", l.name, err)
	}
	if err := s.ctx.Err(); err != nil && st.bug != bugGrantFromDeadSession {
		return nil, fmt.Errorf("fake: lock %s: %w", l.name, context.Cause(s.ctx))
	}
	if err := ctx.Err(); err != nil && st.bug != bugCancelledFreeLock {
		return nil, fmt.Errorf("fake: lock %s: %w", l.name, err)
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
		sessDone := s.ctx.Done()
		if st.bug == bugGrantFromDeadSession {
			sessDone = nil
		}
		select {
		case l.slot <- struct{}{}:
		default:
			select {
			case l.slot <- struct{}{}:
			case <-ctx.Done():
				return nil, fmt.Errorf("fake: lock %s: %w", l.name, ctx.Err())
			case <-sessDone:
				return nil, fmt.Errorf("fake: lock %s: %w", l.name, context.Cause(s.ctx))
			}
		}
	}
	g, err := l.acquireStore(ctx, try, kind, value)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.cur = g
	l.mu.Unlock()
	return g, nil
}

// acquireStore runs with the slot taken; it frees it on failure (after
// the cleanup, in the background if the store does not answer).
func (l *fakeLocker) acquireStore(ctx context.Context, try bool, kind fakeKind, value []byte) (*fakeGrant, error) {
	st, s := l.st, l.sess
	fail := func(err error) (*fakeGrant, error) {
		<-l.slot
		return nil, fmt.Errorf("fake: lock %s: %w", l.name, err)
	}
	if err := s.call(ctx, st.bug == bugLockIgnoresCtx); err != nil {
		return fail(err)
	}
	st.mu.Lock()
	if st.bug != bugNestedIgnored {
		for k, e := range st.keys {
			if e.name != l.name && strings.HasPrefix(k, l.name+"/") {
				st.mu.Unlock()
				return fail(fmt.Errorf("%w: %s is under %s", holdfast.ErrConflict, k, l.name))
			}
		}
	}
	if kind == kindSem && st.bug != bugSemMismatchIgnored {
		for _, o := range st.keys {
			if o.name == l.name && o.kind == kindSem && o.limit != l.limit {
				st.mu.Unlock()
				return fail(fmt.Errorf("%w: limit %d, but %s says %d", holdfast.ErrConflict, l.limit, o.key, o.limit))
			}
		}
	}
	e := &fakeEntry{key: l.key, kind: kind, limit: l.limit, value: slices.Clone(value), name: l.name, sess: s, seq: st.rev + 1}
	if st.bug == bugLateAdmission && !try && (kind == kindSem || kind == kindRead) {
		holders, _ := st.queueLocked(l.name)
		e.late = holders > 0
	}
	if try {
		if kind == kindLock || kind == kindElect {
			holders, waiting := st.queueLocked(l.name)
			if holders > 0 || (len(waiting) > 0 && st.bug != bugTryLockBarges) {
				st.mu.Unlock()
				return fail(holdfast.ErrLocked)
			}
		} else if !st.admitLocked(e) {
			st.mu.Unlock()
			return fail(holdfast.ErrLocked)
		}
	}
	st.rev++
	st.keys[l.key] = e
	st.notifyLocked()
	sessDone := s.ctx.Done()
	if st.bug == bugWaiterIgnoresKill {
		sessDone = nil
	}
	for {
		if st.keys[l.key] != e && st.bug != bugWaiterIgnoresKill {
			st.mu.Unlock()
			return fail(fmt.Errorf("%w: our key was deleted while waiting", holdfast.ErrSessionLost))
		}
		if st.takeLocked(e) {
			g := l.newGrant(e)
			st.mu.Unlock()
			return g, nil
		}
		pred := st.predecessorLocked(e)
		changed := st.changed
		st.mu.Unlock()
		var err error
		select {
		case <-changed:
			// A frozen waiter cannot see the change until the network is
			// back.
			err = s.waitNet(ctx, st.bug == bugLockIgnoresCtx)
		case <-ctx.Done():
			err = ctx.Err()
		case <-sessDone:
			err = context.Cause(s.ctx)
		}
		if err != nil {
			if st.bug == bugObserveGhost {
				st.mu.Lock()
				e.gaveUp = true
				st.mu.Unlock()
			}
			l.cleanup(e)
			return nil, fmt.Errorf("fake: lock %s: %w", l.name, err)
		}
		st.mu.Lock()
		if st.bug == bugHerd || st.predecessorLocked(e) != pred {
			s.requests.Add(1) // a re-read of the queue
		}
	}
}

// cleanup removes a failed waiter's key, in the background once the store
// answers, and frees the slot after that.
func (l *fakeLocker) cleanup(e *fakeEntry) {
	if l.st.bug == bugLeakyCancel {
		<-l.slot
		return
	}
	l.sess.background(func() {
		defer func() { <-l.slot }()
		if l.st.bug == bugObserveGhost {
			time.Sleep(500 * time.Millisecond)
		}
		if l.sess.waitNet(context.Background(), false) == nil {
			l.st.delete(l.key, e)
		}
	})
}

// fakeGrant is a held lock.
type fakeGrant struct {
	l      *fakeLocker
	e      *fakeEntry
	token  holdfast.Token
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	count    int
	ending   bool
	finished chan struct{}
	result   error
}

// newGrant runs under st.mu.
func (l *fakeLocker) newGrant(e *fakeEntry) *fakeGrant {
	g := &fakeGrant{l: l, e: e, token: e.token, count: 1, finished: make(chan struct{})}
	g.ctx, g.cancel = context.WithCancelCause(l.sess.ctx)
	// A deleted key is noticed 100 ms later, as at a periodic check.
	e.lost = func() {
		time.AfterFunc(100*time.Millisecond, func() { g.lose(fmt.Errorf("%w: %s deleted", holdfast.ErrLost, l.key)) })
	}
	context.AfterFunc(g.ctx, g.lost)
	if l.st.bug == bugLeakGoroutine {
		go g.watch(make(chan struct{}))
	}
	return g
}

// watch stands for a watcher goroutine that its grant forgets to stop.
func (g *fakeGrant) watch(stop chan struct{}) { <-stop }

func (g *fakeGrant) lose(cause error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.count > 0 {
		g.cancel(cause)
	}
}

// lost ends the grant after its context ended, unless Unlock did: one
// cleanup attempt, then the slot is freed.
func (g *fakeGrant) lost() {
	g.mu.Lock()
	if g.ending {
		g.mu.Unlock()
		return
	}
	g.ending = true
	g.count = 0
	g.mu.Unlock()
	g.end(func() {
		if g.l.st.bug == bugSemDeadHolderKept && g.e.kind == kindSem {
			return
		}
		if g.l.sess.isUp() {
			if g.l.st.bug == bugLossCleanupUnguarded {
				g.l.st.deleteHolders(g.l.name)
			} else {
				g.l.st.delete(g.l.key, g.e)
			}
		}
	})
}

// end runs release in the background, then frees the slot. The caller has
// set g.ending.
func (g *fakeGrant) end(release func()) {
	g.l.sess.background(func() {
		release()
		g.l.mu.Lock()
		if g.l.cur == g {
			g.l.cur = nil
		}
		g.l.mu.Unlock()
		<-g.l.slot
		close(g.finished)
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

func (g *fakeGrant) Key() string {
	if g.l.st.bug == bugKeyOutside {
		return "elsewhere/" + g.l.key
	}
	return g.l.key
}
func (g *fakeGrant) Token() holdfast.Token    { return g.token }
func (g *fakeGrant) Context() context.Context { return g.ctx }
func (g *fakeGrant) Deadline() time.Time      { return g.l.sess.deadline() }

func (g *fakeGrant) Unlock(ctx context.Context) error {
	st := g.l.st
	if ctx == nil {
		if st.bug == bugNilContext {
			return errors.New("fake: nil context")
		}
		return fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	g.mu.Lock()
	if st.bug == bugUnguardedUnlock {
		held := g.count > 0 && !g.ending
		g.count, g.ending = 0, true
		g.cancel(holdfast.ErrReleased)
		g.mu.Unlock()
		st.deleteHolders(g.l.name)
		if held {
			g.end(func() {})
		}
		return nil
	}
	switch {
	case g.count == 0 || g.ctx.Err() != nil:
		g.mu.Unlock()
		if st.bug == bugStaleUnlockByName {
			st.mu.Lock()
			e := st.keys[g.l.key]
			st.mu.Unlock()
			if e != nil {
				st.delete(g.l.key, e)
			}
		}
		if cause := context.Cause(g.ctx); cause != nil && !errors.Is(cause, holdfast.ErrReleased) {
			return fmt.Errorf("%w: %s: %w", holdfast.ErrNotHeld, g.l.key, cause)
		}
		return fmt.Errorf("%w: %s already released", holdfast.ErrNotHeld, g.l.key)
	case g.count > 1:
		g.count--
		g.mu.Unlock()
		return nil
	}
	g.count, g.ending = 0, true
	toldLate := st.bug == bugElectToldLate && g.e.kind == kindElect
	switch {
	case st.bug == bugReleaseCause:
		g.cancel(nil)
	case toldLate:
		// told 50 ms after the release, below
	default:
		g.cancel(holdfast.ErrReleased)
	}
	g.mu.Unlock()
	if st.bug == bugUnlockCancelLeaves && ctx.Err() != nil {
		g.end(func() {})
		return ctx.Err()
	}
	g.end(func() {
		if g.l.sess.waitNet(context.Background(), false) != nil {
			return // the session ended: its keys went with it
		}
		if !st.delete(g.l.key, g.e) {
			g.result = fmt.Errorf("%w: %s removed from outside", holdfast.ErrNotHeld, g.l.key)
		}
		if toldLate {
			time.Sleep(50 * time.Millisecond)
			g.cancel(holdfast.ErrReleased)
		}
	})
	if st.bug == bugUnlockWaitsForStore {
		<-g.finished
		return g.result
	}
	select {
	case <-g.finished:
		return g.result
	case <-ctx.Done():
		return fmt.Errorf("fake: unlock %s: %w", g.l.key, ctx.Err())
	}
}
