package consul

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

const (
	// lockSuffix makes the lock key of a name: what `consul lock <name>` and
	// api.Lock with LockOptions{Key: name + "/.lock"} use.
	lockSuffix = "/.lock"
	// queueInfix makes the queue prefix of a name; waiters' keys are
	// "<name>/.queue/<session ID>".
	queueInfix = "/.queue/"
	// delayRetry is how often the head of the queue retries while a
	// lock-delay of unknown end is in effect, or once the expected end has
	// passed.
	delayRetry = 25 * time.Millisecond
	// cleanupTimeout bounds the removal of our keys after Lock fails.
	cleanupTimeout = 5 * time.Second
	// maxDropDead bounds how many stale queue entries one cleanup removes.
	maxDropDead = 64
)

// LockKey returns the Consul key of the lock called name: "<name>/.lock".
// An api.Lock on LockOptions{Key: LockKey(name)}, or `consul lock name cmd`,
// excludes holdfast's Mutex on name and the other way round.
func LockKey(name string) string { return name + lockSuffix }

// Mutex is a distributed, fair (FIFO), fenced lock on Consul.
//
// The lock is the key "<name>/.lock", acquired with the session and flagged
// like api.Lock's (api.LockFlagValue), so api.Lock and `consul lock` users of
// the same key exclude holdfast and the other way round. Waiters queue under
// "<name>/.queue/<session ID>", keys acquired with their session and ordered
// by CreateIndex; only the head of the queue tries to acquire the lock, and
// every other waiter watches only the waiter just ahead of it, so a release
// wakes one waiter. A holder that knows the next waiter hands the lock
// directly to it on Unlock (direct handoff: see handOver). Foreign api.Lock
// clients do not queue: they may take the lock ahead of holdfast waiters when
// it is free, but while holdfast waiters queue, a holdfast holder hands it to
// the next of them, so foreign clients get it only when no holdfast waiter
// queues. Either way Consul's lock never lets two sessions hold it.
//
// A Mutex belongs to one Session. Lock and TryLock may be called from many
// goroutines: through one Session, acquisitions of the same name take turns
// in-process, since they share one queue key.
type Mutex struct {
	s           *Session
	name        string
	lockKey     string
	queuePrefix string
	queueKey    string
	reentry     core.Reentry[*Grant]
}

// NewMutex returns the lock called name, taken through session s. The name
// follows holdfast.ValidateName, must not start with "/", and must not have a
// ".lock" or ".queue" path segment (those are holdfast's own keys).
func NewMutex(s *Session, name string, opts ...holdfast.LockOption) (*Mutex, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := validateName(name); err != nil {
		return nil, err
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	cfg := options.ApplyLock(opts)
	return &Mutex{
		s:           s,
		name:        name,
		lockKey:     LockKey(name),
		queuePrefix: name + queueInfix,
		queueKey:    name + queueInfix + s.id,
		reentry:     core.Reentry[*Grant]{Enabled: cfg.Reentrant},
	}, nil
}

// validateName adds Consul's rules to holdfast.ValidateName.
func validateName(name string) error {
	if err := holdfast.ValidateName(name); err != nil {
		return err
	}
	if strings.HasPrefix(name, "/") {
		return fmt.Errorf("%w: %q starts with /", holdfast.ErrInvalidName, name)
	}
	for seg := range strings.SplitSeq(name, "/") {
		if seg == ".lock" || seg == ".queue" {
			return fmt.Errorf("%w: %q has a %q segment, reserved for holdfast's keys", holdfast.ErrInvalidName, name, seg)
		}
	}
	return nil
}

// Name returns the lock's name.
func (m *Mutex) Name() string { return m.name }

// Key returns the lock key, "<name>/.lock".
func (m *Mutex) Key() string { return m.lockKey }

// Lock waits until the lock is granted (first come, first served among
// holdfast waiters), ctx is done, or the session ends, and returns an
// *consul.Grant. On error nothing of this call is left in Consul; the error
// matches ctx's error if ctx ended the wait, and wraps
// holdfast.ErrSessionLost or holdfast.ErrSessionClosed if the session did.
// An acquire already sent when ctx ends is completed, so that its outcome is
// known: if it took the lock, the grant is returned.
func (m *Mutex) Lock(ctx context.Context) (holdfast.Grant, error) { return m.lock(ctx, false) }

// TryLock takes the lock only if nobody holds it or waits for it, and
// returns an error wrapping holdfast.ErrLocked at once otherwise. It writes
// nothing when it fails.
func (m *Mutex) TryLock(ctx context.Context) (holdfast.Grant, error) { return m.lock(ctx, true) }

func (m *Mutex) lock(ctx context.Context, try bool) (holdfast.Grant, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("holdfast/consul: lock %s: %w", m.name, err)
	}
	if g, ok := m.reentry.Enter(); ok {
		return g, nil
	}
	end, err := m.s.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	wctx, cancel := m.s.bind(ctx)
	defer cancel()
	a := &acquisition{m: m, ctx: ctx, wctx: wctx}

	var free func()
	if try {
		var ok bool
		if free, ok = m.s.names.TryAcquire(m.name); !ok {
			return nil, fmt.Errorf("%w: %s is being taken through this session", holdfast.ErrLocked, m.name)
		}
	} else if free, err = m.s.names.Acquire(wctx, m.name); err != nil {
		return nil, a.fail(err)
	}
	// A lock key handed to an earlier acquisition of ours that gave up, and
	// not released since, would look like an old grant of ours: clean it up
	// first, while we hold the name.
	if err := m.s.cleanLeftover(wctx, m.name); err != nil {
		free()
		return nil, a.fail(err)
	}
	token, err := a.run(try)
	if err != nil {
		a.cleanup()
		free()
		return nil, a.fail(err)
	}
	return m.grant(token, a.next, free)
}

// grant wraps an acquired lock key in a Grant whose context is a child of the
// session's. next is the waiter to hand the lock to on Unlock, if known. free
// releases the in-process name when the grant ends.
func (m *Mutex) grant(token uint64, next *api.KVPair, free func()) (holdfast.Grant, error) {
	m.s.hold(m.lockKey, token)
	g := &Grant{s: m.s, token: token, next: next}
	g.base = core.NewGrant(m.s.keeper, m.s.bg, m.lockKey, holdfast.Token(token), g.release, free)
	if g.Context().Err() != nil {
		// The session ended while we acquired: hand out no grant of a dead
		// session, and give the key back at once.
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_ = m.s.release(ctx, m.lockKey, token)
		return nil, m.s.alive()
	}
	m.reentry.Remember(g, g.base)
	return g, nil
}

// outcome is what an attempt to acquire the lock key came to.
type outcome int

const (
	taken   outcome = iota // we hold the lock key
	busy                   // another session holds it, or it changed since we read it
	delayed                // a lock-delay is in effect on it
)

// acquisition is one Lock or TryLock call in progress.
type acquisition struct {
	m    *Mutex
	ctx  context.Context // the caller's
	wctx context.Context // ends with ctx or with the session

	queued    bool // our queue key may exist in Consul
	uncertain bool // an acquire was sent whose outcome we did not learn

	// since is the CreateIndex of our first queue key: a lock key held by
	// our session with a greater ModifyIndex was handed to us (an older one
	// is a stale read of an earlier grant). queueIndex is the CreateIndex of
	// our latest queue key.
	since      uint64
	queueIndex uint64
	// next is the waiter to hand the lock to on Unlock: the first live queue
	// entry other than ours in the latest view of the queue we had.
	next *api.KVPair

	// Lock-delay bookkeeping of the head of the queue: the session last seen
	// holding the lock key, its lock-delay (if known), and when the delay
	// that follows its release should be over.
	holder    string
	delay     time.Duration
	known     bool
	notBefore time.Time
}

// run is the whole protocol; it returns the fencing token.
//
//  1. Read the lock key and the queue (one read-only transaction). If the
//     lock is free and nobody is queued, acquire it directly.
//  2. Otherwise (TryLock: fail with ErrLocked) queue up: create our queue key
//     with our session, and read the lock key and the queue in the same
//     transaction.
//  3. While a live entry is ahead of ours, wait for the one just ahead to
//     change (blocking query), then read again.
//  4. At the head: wait for the lock key to be free (blocking query), then
//     acquire it and delete our queue key in one transaction, guarded by the
//     lock key being as we saw it, which also reads the queue (so that we
//     know whom to hand the lock to). A lock-delay refusal is retried when
//     the delay of the previous holder's session ends.
//  5. Anywhere in steps 3 and 4, the lock key may turn out held by our own
//     session, written after we queued: the holder before us handed it to us
//     (and deleted our queue key). The token is its ModifyIndex.
//
// Unlock hands the lock to the next waiter in one transaction (see
// handOver), or releases it when it knows of none or the handoff fails.
func (a *acquisition) run(try bool) (uint64, error) {
	m := a.m
	v, err := a.read()
	if err != nil {
		return 0, err
	}
	if err := m.compatible(v.lock); err != nil {
		return 0, err
	}
	if !try { // TryLock writes nothing unless it takes the lock
		a.dropDead(v.dead)
	}
	if free(v.lock) && len(v.queue) == 0 {
		token, out, err := a.take(v.lock)
		switch {
		case err != nil:
			return 0, err
		case out == taken:
			return token, nil
		case try && out == delayed:
			return 0, fmt.Errorf("%w: %s is in its lock-delay after its holder's session ended", holdfast.ErrLocked, m.name)
		}
		// Another contender was faster, or a lock-delay is in effect: queue.
	}
	if try {
		return 0, fmt.Errorf("%w: %s is held or waited for", holdfast.ErrLocked, m.name)
	}
	if v, err = a.enqueue(); err != nil {
		return 0, err
	}
	return a.wait(v)
}

// wait runs steps 3 and 4 of the protocol from the view v.
func (a *acquisition) wait(v view) (uint64, error) {
	m := a.m
	for {
		if err := a.wctx.Err(); err != nil {
			return 0, err
		}
		if err := m.compatible(v.lock); err != nil {
			return 0, err
		}
		if a.handedToUs(v.lock) {
			return a.acceptHandoff(v)
		}
		a.dropDead(v.dead)
		v.dead = nil
		if v.me == nil {
			// Our queue key vanished or lost its session. Queue up again;
			// if our session is gone, Consul says so.
			var err error
			if v, err = a.enqueue(); err != nil {
				return 0, err
			}
			continue
		}
		if p := v.predecessor(); p != nil {
			if _, err := a.watch(p.Key, p.ModifyIndex); err != nil {
				return 0, err
			}
			var err error
			if v, err = a.read(); err != nil {
				return 0, err
			}
			continue
		}
		// Head of the queue: nobody can queue ahead of us any more.
		if !free(v.lock) {
			lock, err := a.waitRelease(v.lock)
			if err != nil {
				return 0, err
			}
			v.lock = lock
			continue
		}
		token, out, err := a.take(v.lock)
		switch {
		case err != nil:
			return 0, err
		case out == taken:
			return token, nil
		case out == delayed:
			if !sleep(a.wctx, a.delayLeft()) {
				return 0, a.wctx.Err()
			}
		default: // busy: a foreign client took it, or it changed
			lock, err := a.get(m.lockKey)
			if err != nil {
				return 0, err
			}
			v.lock = lock
		}
	}
}

// handedToUs reports whether lock is held by our session through a write
// made after we queued: a handoff to us. (An acquire of ours returns its own
// outcome; an older write is a stale read of an earlier grant of ours, since
// an acquisition holds the name in-process, and leftovers are cleaned first.)
func (a *acquisition) handedToUs(lock *api.KVPair) bool {
	return a.since != 0 && lock != nil && lock.Session == a.m.s.id && lock.ModifyIndex > a.since
}

// acceptHandoff takes the lock handed to us in view v. The handoff deleted
// the queue key we had then; a queue key created after it (a re-queue that
// crossed the handoff) is deleted here.
func (a *acquisition) acceptHandoff(v view) (uint64, error) {
	token := v.lock.ModifyIndex
	if a.queueIndex > token {
		ctx, cancel := context.WithTimeout(a.wctx, requestTimeout)
		defer cancel()
		if _, err := a.m.s.txn(ctx, api.TxnOps{kvOp(api.KVDelete, a.m.queueKey)}); err != nil {
			return 0, err // cleanup releases the lock and deletes the key
		}
	}
	a.queued = false
	a.next = a.m.successor(v.queue)
	return token, nil
}

// waitRelease blocks until the held lock key changes, and returns it as it
// then is. It learns the holder's lock-delay first (while the holder's
// session still exists), so that a release by invalidation is followed by a
// retry right when the delay ends.
func (a *acquisition) waitRelease(lock *api.KVPair) (*api.KVPair, error) {
	if lock.Session != a.holder {
		a.holder = lock.Session
		a.delay, a.known = a.m.s.lockDelayOf(a.wctx, lock.Session)
	}
	next, err := a.watch(a.m.lockKey, lock.ModifyIndex)
	if err != nil {
		return nil, err
	}
	if free(next) {
		a.notBefore = time.Time{}
		if a.known {
			a.notBefore = time.Now().Add(a.delay)
		}
	}
	return next, nil
}

// delayLeft is how long to wait after a lock-delay refusal: until the
// expected end of the delay, or delayRetry when that is unknown or past.
func (a *acquisition) delayLeft() time.Duration {
	if d := time.Until(a.notBefore); d > 0 {
		return min(d, MaxLockDelay)
	}
	return delayRetry
}

// take tries to acquire the lock key in one transaction: guarded by the key
// being as seen (absent, or at its ModifyIndex), it locks the key with our
// session and our flags, deletes our queue key if we queued, and reads the
// queue. The token is the ModifyIndex of that write, read from the answer;
// the first waiter in the queue is whom Unlock hands the lock to.
func (a *acquisition) take(seen *api.KVPair) (uint64, outcome, error) {
	m := a.m
	ops := make(api.TxnOps, 0, 4)
	if seen == nil {
		ops = append(ops, kvOp(api.KVCheckNotExists, m.lockKey))
	} else {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: m.lockKey, Index: seen.ModifyIndex}})
	}
	ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.lockKey, Flags: api.LockFlagValue, Session: m.s.id}})
	if a.queued {
		ops = append(ops, kvOp(api.KVDelete, m.queueKey))
	}
	ops = append(ops, kvOp(api.KVGetTree, m.queuePrefix))
	// Not cancelled with the caller's context: the outcome of this write
	// must be known (a grant acquired as the caller gives up is returned).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.wctx), requestTimeout)
	defer cancel()
	resp, err := m.s.txn(ctx, ops)
	var rb *rollback
	switch {
	case err == nil:
	case errors.As(err, &rb) && rb.denied():
		return 0, 0, txnError("acquire "+m.lockKey, rb)
	case rb != nil && rb.lockDelayed():
		return 0, delayed, nil
	case rb != nil && rb.sessionGone():
		return 0, 0, a.sessionGone()
	case rb != nil:
		return 0, busy, nil
	default:
		a.uncertain = true
		return 0, 0, err
	}
	// The answer: the check-index's entry (if any, not ours), the lock
	// operation's entry (ours), then the queue.
	var token uint64
	var tree []*api.TxnResult
	for _, r := range resp.Results {
		switch e := r.KV; {
		case e == nil:
		case e.Key == m.lockKey && e.Session == m.s.id && e.ModifyIndex != 0:
			token = e.ModifyIndex
		case strings.HasPrefix(e.Key, m.queuePrefix):
			tree = append(tree, r)
		}
	}
	if token == 0 {
		a.uncertain = true
		return 0, 0, errors.New("holdfast/consul: acquire: Consul's answer has no lock entry")
	}
	a.queued = false
	queue, _, _ := m.parseQueue(tree)
	a.next = m.successor(queue)
	return token, taken, nil
}

// handOver ends the grant of key held with token: when next (a queue entry)
// is known, one transaction releases the key and acquires it for next's
// session, guarded by our hold and by next's entry being unchanged and still
// of a live session, and deletes that entry; next's waiter sees the key held
// by its session and takes the grant, with the ModifyIndex of this write as
// its token. If the handoff fails (next gave up, its session ended, an ACL
// refuses it), the key is released plainly and the queue goes on as usual.
func (s *Session) handOver(ctx context.Context, key string, token uint64, next *api.KVPair) error {
	if next == nil {
		return s.release(ctx, key, token)
	}
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: key, Session: s.id}},
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: key, Index: token}},
		{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: key, Flags: api.LockFlagValue, Session: s.id}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Flags: api.LockFlagValue, Session: next.Session}},
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: next.Key, Session: next.Session}},
		{KV: &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: next.Key, Index: next.ModifyIndex}},
	}
	_, err := s.txn(ctx, ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return s.release(ctx, key, token)
	case err != nil:
		return err
	}
	s.forget(key, token)
	return nil
}

// enqueue creates our queue key (step 2) and returns the view of the lock
// read in the same transaction. A leftover queue key of ours is replaced, so
// that our place is always at the back.
func (a *acquisition) enqueue() (view, error) {
	m := a.m
	ops := api.TxnOps{
		kvOp(api.KVDelete, m.queueKey),
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.queueKey, Session: m.s.id}},
		kvOp(api.KVGetOrEmpty, m.lockKey),
		kvOp(api.KVGetTree, m.queuePrefix),
	}
	a.queued = true // from now on, until a take deletes it
	ctx, cancel := context.WithTimeout(a.wctx, requestTimeout)
	defer cancel()
	resp, err := m.s.txn(ctx, ops)
	var rb *rollback
	switch {
	case err == nil:
	case errors.As(err, &rb) && rb.denied():
		return view{}, txnError("queue up on "+m.name, rb)
	case rb != nil && (rb.sessionGone() || rb.lockDelayed()):
		// Our own queue key can only be in a lock-delay if our session was
		// invalidated.
		return view{}, a.sessionGone()
	case rb != nil:
		return view{}, txnError("queue up on "+m.name, rb)
	default:
		return view{}, err
	}
	if len(resp.Results) < 2 {
		return view{}, fmt.Errorf("holdfast/consul: queue up on %s: short answer from Consul", m.name)
	}
	v, err := m.parse(resp.Results[1], resp.Results[2:])
	if err == nil && v.me != nil {
		a.queueIndex = v.me.CreateIndex
		if a.since == 0 {
			a.since = v.me.CreateIndex
		}
	}
	return v, err
}

// read returns the lock key and the queue, in one read-only transaction.
func (a *acquisition) read() (view, error) {
	m := a.m
	ops := api.TxnOps{kvOp(api.KVGetOrEmpty, m.lockKey), kvOp(api.KVGetTree, m.queuePrefix)}
	ctx, cancel := context.WithTimeout(a.wctx, requestTimeout)
	defer cancel()
	resp, err := m.s.txn(ctx, ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return view{}, txnError("read "+m.name, rb)
	case err != nil:
		return view{}, err
	case len(resp.Results) == 0:
		return view{}, fmt.Errorf("%w: holdfast/consul: read %s: no answer for the lock key (filtered by an ACL?)", holdfast.ErrPermissionDenied, m.lockKey)
	}
	return m.parse(resp.Results[0], resp.Results[1:])
}

// get reads one key, without blocking.
func (a *acquisition) get(key string) (*api.KVPair, error) {
	ctx, cancel := context.WithTimeout(a.wctx, requestTimeout)
	defer cancel()
	pair, _, err := a.m.s.client.KV().Get(key, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, apiError("read "+key, err)
	}
	return pair, nil
}

// watch blocks until key's ModifyIndex is no longer index (it changed or is
// gone), and returns the key as it then is (nil if gone). Each blocking query
// waits at most blockWait and has a client-side timeout; timeouts and
// transport errors are retried until wctx ends (with the session, if the
// store stays unreachable).
func (a *acquisition) watch(key string, index uint64) (*api.KVPair, error) {
	wait := index
	pause := minPause
	for {
		ctx, cancel := context.WithTimeout(a.wctx, blockTimeout(blockWait))
		q := &api.QueryOptions{WaitIndex: wait, WaitTime: blockWait}
		pair, meta, err := a.m.s.client.KV().Get(key, q.WithContext(ctx))
		cancel()
		switch {
		case a.wctx.Err() != nil:
			return nil, a.wctx.Err()
		case err != nil && statusCode(err) >= 400 && statusCode(err) < 500:
			return nil, apiError("watch "+key, err)
		case err != nil:
			if !sleep(a.wctx, pause) {
				return nil, a.wctx.Err()
			}
			pause = min(2*pause, maxPause)
			continue
		case pair == nil || pair.ModifyIndex != index:
			return pair, nil
		}
		pause = minPause
		wait = max(meta.LastIndex, index)
	}
}

// dropDead deletes queue entries whose session is gone (left by sessions
// with Behavior release), if they are unchanged. It is best effort: such
// entries are ignored anyway.
func (a *acquisition) dropDead(dead []*api.KVPair) {
	if len(dead) == 0 {
		return
	}
	dead = dead[:min(len(dead), maxDropDead)]
	ops := make(api.TxnOps, 0, len(dead))
	for _, e := range dead {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: e.Key, Index: e.ModifyIndex}})
	}
	ctx, cancel := context.WithTimeout(a.wctx, requestTimeout)
	defer cancel()
	_, _ = a.m.s.txn(ctx, ops)
}

// cleanup removes what a failed acquisition may have left: our queue key,
// and the lock key if an acquire of unknown outcome did take it. It uses a
// context of its own, since the caller's may be done. If Consul cannot be
// reached, the session retries later (see Session.retryLeftovers): a stale
// queue key of a live session would otherwise stop the queue behind it.
func (a *acquisition) cleanup() {
	if !a.queued && !a.uncertain {
		return
	}
	m := a.m
	l := leftover{name: m.name, lockKey: m.lockKey, queueKey: m.queueKey, queued: a.queued, uncertain: a.uncertain}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := m.s.clean(ctx, l); err != nil {
		m.s.addLeftover(l)
	}
}

// sessionGone ends the session after Consul said it does not exist.
func (a *acquisition) sessionGone() error {
	s := a.m.s
	s.keeper.End(fmt.Errorf("%w: consul session %s no longer exists", holdfast.ErrSessionLost, s.id))
	return s.keeper.Err()
}

// fail picks the error a failed acquisition returns: the caller's context
// error if it ended the call, the session's cause if the session did, err
// otherwise.
func (a *acquisition) fail(err error) error {
	if a.wctx.Err() == nil {
		return err
	}
	if cerr := a.ctx.Err(); cerr != nil {
		return fmt.Errorf("holdfast/consul: lock %s: %w", a.m.name, cerr)
	}
	if serr := a.m.s.alive(); serr != nil {
		return serr
	}
	return err
}

// view is what we know of a lock: its key and its queue.
type view struct {
	lock  *api.KVPair   // nil if absent
	queue []*api.KVPair // live queue entries, by CreateIndex
	dead  []*api.KVPair // queue entries whose session is gone
	me    *api.KVPair   // our live queue entry, if any
}

// parse builds a view from a get-or-empty of the lock key and a get-tree of
// the queue prefix.
func (m *Mutex) parse(lock *api.TxnResult, tree []*api.TxnResult) (view, error) {
	if lock == nil || lock.KV == nil || lock.KV.Key != m.lockKey {
		return view{}, fmt.Errorf("%w: holdfast/consul: read %s: no answer for the lock key (filtered by an ACL?)", holdfast.ErrPermissionDenied, m.lockKey)
	}
	var v view
	if lock.KV.ModifyIndex != 0 { // get-or-empty answers index 0 for no key
		v.lock = lock.KV
	}
	v.queue, v.dead, v.me = m.parseQueue(tree)
	return v, nil
}

// parseQueue sorts the results of a get-tree of the queue prefix into live
// entries (by CreateIndex), dead ones, and our own live one.
func (m *Mutex) parseQueue(tree []*api.TxnResult) (queue, dead []*api.KVPair, me *api.KVPair) {
	for _, r := range tree {
		e := r.KV
		if e == nil {
			continue
		}
		id, ok := strings.CutPrefix(e.Key, m.queuePrefix)
		if !ok || id == "" || strings.Contains(id, "/") {
			continue
		}
		if e.Session == "" {
			dead = append(dead, e)
			continue
		}
		queue = append(queue, e)
		if e.Key == m.queueKey && e.Session == m.s.id {
			me = e
		}
	}
	slices.SortFunc(queue, func(x, y *api.KVPair) int { return cmp.Compare(x.CreateIndex, y.CreateIndex) })
	return queue, dead, me
}

// successor returns the first live entry of queue (sorted) other than ours:
// the next waiter, to hand the lock to.
func (m *Mutex) successor(queue []*api.KVPair) *api.KVPair {
	for _, e := range queue {
		if e.Key != m.queueKey {
			return e
		}
	}
	return nil
}

// predecessor returns the live entry just ahead of ours, or nil at the head.
func (v view) predecessor() *api.KVPair {
	var p *api.KVPair
	for _, e := range v.queue {
		if e.CreateIndex >= v.me.CreateIndex {
			break
		}
		p = e
	}
	return p
}

// free reports whether the lock key is absent or held by no session.
func free(lock *api.KVPair) bool { return lock == nil || lock.Session == "" }

// compatible returns an error wrapping holdfast.ErrConflict if the lock key
// exists with flags other than a lock's (a semaphore's, say).
func (m *Mutex) compatible(lock *api.KVPair) error {
	if lock != nil && lock.Flags != api.LockFlagValue {
		return fmt.Errorf("%w: %s has flags %#x, not a lock's %#x", holdfast.ErrConflict, m.lockKey, lock.Flags, uint64(api.LockFlagValue))
	}
	return nil
}
