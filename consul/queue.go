package consul

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

const (
	// delayRetry is how often the head of the queue retries while a
	// lock-delay of unknown end is in effect, or once the expected end has
	// passed.
	delayRetry = 25 * time.Millisecond
	// maxDropDead bounds how many stale queue entries one request removes.
	maxDropDead = 64
)

// The value of a lock key that holdfast holds says what its holder knows of
// the queue, so that the head of the queue can tell whether the holder will
// hand the lock to it on Unlock, and announce itself if not:
//
//   - valueTaken: the holder took the free key; the same transaction read
//     the queue, so it knows every entry created before the key's
//     ModifyIndex.
//   - valueNext + "<session> <index>" (or nothing after the "="): the key
//     was handed over; the new holder will hand it on to that queue entry
//     (or knows none). It may know more, from its own reads.
//   - valueWaiter + "<token>": a waiter announced itself after the holder
//     acquired the key with token (see announce); the write moved the key's
//     ModifyIndex, so the holder's Unlock reads the queue (see
//     Grant.release).
//
// Foreign holders (api.Lock, `consul lock`) write other values: they never
// hand over, so nobody announces to them.
const (
	valueTaken  = "holdfast"
	valueNext   = "holdfast next="
	valueWaiter = "holdfast waiter token="
)

// waiter is a queue entry the lock can be handed to.
type waiter struct {
	key, session string
	index        uint64 // the entry's ModifyIndex
}

// nextValue is the lock key's value when it is handed over to a holder whose
// known successor is the first of rest.
func nextValue(rest []waiter) []byte {
	if len(rest) == 0 {
		return []byte(valueNext)
	}
	return fmt.Appendf(nil, "%s%s %d", valueNext, rest[0].session, rest[0].index)
}

// tokenOf returns the token of the grant behind lock: the ModifyIndex of the
// write that acquired it, which an announcement (valueWaiter) keeps in the
// value.
func tokenOf(lock *api.KVPair) uint64 {
	if v, ok := strings.CutPrefix(string(lock.Value), valueWaiter); ok {
		if t, err := strconv.ParseUint(v, 10, 64); err == nil {
			return t
		}
	}
	return lock.ModifyIndex
}

// acquisition is one Lock or TryLock call in progress.
type acquisition struct {
	m    *Mutex
	ctx  context.Context // the caller's
	wctx context.Context // ends with ctx or with the session
	el   *campaign       // an election's campaign, else nil (see campaign)

	// left is set once something of ours may be in Consul: a queue key, or
	// the lock key (an acquire of unknown outcome, a handoff to us). On
	// failure, the session cleans it up (see Session.cleanUp).
	left bool
	// since is the CreateIndex of our first queue key: a lock key held by
	// our session through a write after it was handed to us. queueIndex is
	// the CreateIndex of our latest queue key.
	since, queueIndex uint64
	// next is whom the grant hands the lock to on Unlock, as far as we know
	// when we get it: up to two waiters, in queue order.
	next []waiter

	// Lock-delay bookkeeping of the head of the queue: the session last seen
	// holding the lock key, its lock-delay (if known), and when the delay
	// that follows its release should be over.
	holder    string
	delay     time.Duration
	known     bool
	notBefore time.Time
}

// outcome is what an attempt to acquire the lock key came to.
type outcome int

const (
	taken   outcome = iota // we hold the lock key
	busy                   // another session holds it, or it changed since we read it
	delayed                // a lock-delay is in effect on it
)

// run is the waiting algorithm of a Mutex; it returns the fencing token.
//
//  1. Read the subtree "<name>/" (one read-only transaction): the lock key,
//     the queue "<name>/.queue/", and any key of a longer name (then fail
//     with ErrConflict). If the lock is free and nobody queues, take it
//     (step 5).
//  2. Otherwise (TryLock: fail with ErrLocked) queue up: create our queue
//     key with our session, and read the subtree, in one transaction.
//  3. While a live entry is ahead of ours, wait for the one just ahead to
//     change (a blocking query), then read the subtree again.
//  4. At the head of the queue, while another session holds the lock: if
//     its holder may not know of us (see the lock values above), announce
//     us with a write to the lock key that keeps its holder (see announce);
//     then wait for the lock key to change (a blocking query).
//  5. When the lock key is free: acquire it in one transaction guarded by
//     the key being as we saw it, which also deletes our queue key and
//     reads the subtree (whom to hand the lock to). A lock-delay refusal is
//     retried when the previous holder's delay ends.
//  6. Anywhere in steps 3 to 5, the lock key may turn out held by our own
//     session through a write made after we queued: the holder before us
//     handed it to us, and deleted our queue key (see Grant.handOver). The
//     token is that write's ModifyIndex.
//
// Every request is bounded by wctx: the caller's context, ended with the
// session. What a failed run leaves is removed by the caller (see left).
func (a *acquisition) run(try bool) (uint64, error) {
	m := a.m
	v, err := a.read()
	if err != nil {
		return 0, err
	}
	if err := m.compatible(v); err != nil {
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

// wait runs steps 3 to 6 from the view v.
func (a *acquisition) wait(v view) (uint64, error) {
	m := a.m
	for {
		if err := a.wctx.Err(); err != nil {
			return 0, err
		}
		if err := m.compatible(v); err != nil {
			return 0, err
		}
		if a.handedToUs(v.lock) {
			if a.el != nil {
				return a.retake() // from a Mutex on the same name
			}
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
			if a.mustAnnounce(v) {
				lock, err := a.announce(v.lock)
				if err != nil {
					return 0, err
				}
				v.lock = lock
				continue
			}
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
// an acquisition holds the name in-process, and leftovers are cleaned up
// before the name is free.)
func (a *acquisition) handedToUs(lock *api.KVPair) bool {
	return a.since != 0 && lock != nil && lock.Session == a.m.s.id && tokenOf(lock) > a.since
}

// acceptHandoff takes the lock handed to us in view v. The handoff deleted
// the queue key we had then; a queue key created after it (a re-queue that
// crossed the handoff) is deleted here. Whom we hand the lock to on Unlock:
// the waiter named in the lock's value, and those behind us in our last
// read of the queue.
func (a *acquisition) acceptHandoff(v view) (uint64, error) {
	token := tokenOf(v.lock)
	if a.queueIndex > token {
		ctx, cancel := context.WithTimeout(a.wctx, requestTimeout)
		defer cancel()
		if _, err := a.m.s.txn(ctx, api.TxnOps{kvOp(api.KVDelete, a.m.queueKey)}); err != nil {
			return 0, err // the cleanup releases the lock and deletes the key
		}
	}
	known := slices.Clone(v.queue)
	if w, ok := a.m.named(v.lock); ok {
		known = append(known, &api.KVPair{Key: w.key, Session: w.session, ModifyIndex: w.index, CreateIndex: w.index})
	}
	slices.SortFunc(known, func(x, y *api.KVPair) int { return cmp.Compare(x.CreateIndex, y.CreateIndex) })
	a.next = a.m.successors(slices.CompactFunc(known, func(x, y *api.KVPair) bool { return x.Key == y.Key }))
	return token, nil
}

// mustAnnounce reports whether the holder of lock (not us), a holdfast
// holder, may not know of our queue entry, and so would not hand us the
// lock on Unlock (see the lock values above).
func (a *acquisition) mustAnnounce(v view) bool {
	val := string(v.lock.Value)
	switch {
	case a.el != nil: // an election's value is the leader's: never written by others
		return false
	case val == valueTaken:
		return v.me.CreateIndex > v.lock.ModifyIndex
	case strings.HasPrefix(val, valueNext):
		w, ok := a.m.named(v.lock)
		return !ok || w.session != a.m.s.id
	default: // announced already, or a foreign holder
		return false
	}
}

// announce tells the holder of lock that we wait: a cas on the lock key at
// the index we saw, with the same flags and our announcement as its value.
// A write that is not an acquire keeps the key's session, so the holder
// still holds it; but its Unlock, whose fast path is guarded by the key's
// ModifyIndex being its token, now fails over to reading the queue and
// handing the lock to its head. It returns the lock key as it then is.
func (a *acquisition) announce(lock *api.KVPair) (*api.KVPair, error) {
	m := a.m
	value := fmt.Appendf(nil, "%s%d", valueWaiter, lock.ModifyIndex)
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: m.lockKey, Index: lock.ModifyIndex, Flags: lock.Flags, Value: value}}}
	ctx, cancel := context.WithTimeout(a.wctx, requestTimeout)
	defer cancel()
	resp, err := m.s.txn(ctx, ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.denied():
		return nil, txnError("announce on "+m.lockKey, rb)
	case rb != nil: // the key changed meanwhile: see how it is now
		return a.get(m.lockKey)
	case err != nil:
		return nil, err
	}
	now := *lock
	now.Value = value
	if len(resp.Results) > 0 && resp.Results[0].KV != nil {
		now.ModifyIndex = resp.Results[0].KV.ModifyIndex
	}
	return &now, nil
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
// session, our flags and valueTaken, deletes our queue key if we queued, and
// reads the subtree. The token is the ModifyIndex of that write; the first
// waiters of the queue are whom Unlock hands the lock to.
func (a *acquisition) take(seen *api.KVPair) (uint64, outcome, error) {
	m := a.m
	ops := make(api.TxnOps, 0, 4)
	value := []byte(valueTaken)
	switch {
	case seen == nil:
		ops = append(ops, kvOp(api.KVCheckNotExists, m.lockKey))
	case a.el != nil: // the lock key is created anew: see campaign
		ops = append(ops, deleteCAS(m.lockKey, seen.ModifyIndex))
	default:
		ops = append(ops, checkIndex(m.lockKey, seen.ModifyIndex))
	}
	if a.el != nil {
		value = a.el.value
	}
	ops = append(ops, lockOp(m.lockKey, m.s.id, value))
	if a.queueIndex != 0 {
		ops = append(ops, kvOp(api.KVDelete, m.queueKey))
	}
	ops = append(ops, kvOp(api.KVGetTree, m.prefix))
	ctx, cancel := context.WithTimeout(a.wctx, requestTimeout)
	defer cancel()
	a.left = true // until we know the outcome
	resp, err := m.s.txn(ctx, ops)
	var rb *rollback
	switch {
	case err == nil:
	case errors.As(err, &rb) && rb.denied():
		return 0, 0, txnError("acquire "+m.lockKey, rb)
	case rb != nil && rb.lockDelayed():
		a.left = a.queueIndex != 0
		return 0, delayed, nil
	case rb != nil && rb.sessionGone():
		return 0, 0, m.s.ended()
	case rb != nil:
		a.left = a.queueIndex != 0
		return 0, busy, nil
	default:
		return 0, 0, err
	}
	// The answer: the check's entry (if any), the lock operation's entry
	// (ours), then the subtree, which has the lock key (ours) too.
	v := m.parse(resp.Results)
	if v.lock == nil || v.lock.Session != m.s.id {
		return 0, 0, errors.New("holdfast/consul: acquire: Consul's answer has no lock entry of ours")
	}
	if err := m.compatible(v); err != nil {
		return 0, 0, err // the cleanup releases the key
	}
	a.next = m.successors(v.queue)
	return v.lock.ModifyIndex, taken, nil
}

// enqueue creates our queue key (step 2) and returns the view of the lock
// read in the same transaction. A leftover queue key of ours is replaced, so
// that our place is always at the back.
func (a *acquisition) enqueue() (view, error) {
	m := a.m
	ops := api.TxnOps{
		kvOp(api.KVDelete, m.queueKey),
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.queueKey, Session: m.s.id}},
		kvOp(api.KVGetTree, m.prefix),
	}
	a.left = true
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
		return view{}, m.s.ended()
	case rb != nil:
		return view{}, txnError("queue up on "+m.name, rb)
	default:
		return view{}, err
	}
	v := m.parse(resp.Results)
	if v.me != nil {
		a.queueIndex = v.me.CreateIndex
		if a.since == 0 {
			a.since = v.me.CreateIndex
		}
	}
	return v, nil
}

// read returns the subtree of the lock, in one read-only transaction.
func (a *acquisition) read() (view, error) {
	m := a.m
	ctx, cancel := context.WithTimeout(a.wctx, requestTimeout)
	defer cancel()
	resp, err := m.s.txn(ctx, api.TxnOps{kvOp(api.KVGetTree, m.prefix)})
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return view{}, txnError("read "+m.name, rb)
	case err != nil:
		return view{}, err
	}
	return m.parse(resp.Results), nil
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
// gone), and returns the key as it then is (nil if gone); see
// Session.watchKey.
func (a *acquisition) watch(key string, index uint64) (*api.KVPair, error) {
	return a.m.s.watchKey(a.wctx, key, index, 0)
}

// dropDead deletes queue entries whose session is gone; see
// Session.dropDead.
func (a *acquisition) dropDead(dead []*api.KVPair) { a.m.s.dropDead(a.wctx, dead) }

// watchKey blocks until key's ModifyIndex is no longer index (it changed or
// is gone), and returns the key as it then is (nil if gone). Each blocking
// query waits at most blockWait and has a client-side timeout; timeouts and
// transport errors are retried until ctx ends (with the session, if the
// store stays unreachable). With bound > 0 it returns nil, nil once bound
// has passed without a change.
func (s *Session) watchKey(ctx context.Context, key string, index uint64, bound time.Duration) (*api.KVPair, error) {
	wait := index
	pause := minPause
	start := time.Now()
	for {
		w := blockWait
		if bound > 0 {
			if w = min(w, bound-time.Since(start)); w <= 0 {
				return nil, nil
			}
		}
		qctx, cancel := context.WithTimeout(ctx, blockTimeout(w))
		q := &api.QueryOptions{WaitIndex: wait, WaitTime: w}
		pair, meta, err := s.client.KV().Get(key, q.WithContext(qctx))
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil && statusCode(err) >= 400 && statusCode(err) < 500:
			return nil, apiError("watch "+key, err)
		case err != nil:
			if !sleep(ctx, pause) {
				return nil, ctx.Err()
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

// dropDead deletes keys whose session is gone (queue entries, contender
// keys, left by sessions with Behavior release), if they are unchanged, at
// most maxDropDead at a time. It is best effort: such keys are ignored
// anyway.
func (s *Session) dropDead(ctx context.Context, dead []*api.KVPair) {
	if len(dead) == 0 {
		return
	}
	dead = dead[:min(len(dead), maxDropDead)]
	ops := make(api.TxnOps, 0, len(dead))
	for _, e := range dead {
		ops = append(ops, deleteCAS(e.Key, e.ModifyIndex))
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, _ = s.txn(ctx, ops)
}

// view is what we know of a lock: the keys under "<name>/".
type view struct {
	lock  *api.KVPair   // nil if absent
	queue []*api.KVPair // live queue entries, by CreateIndex
	dead  []*api.KVPair // queue entries whose session is gone
	me    *api.KVPair   // our live queue entry, if any
	other string        // a key of a longer name, if any
}

// parse builds a view from the results of a transaction that read the
// subtree "<name>/" (other results about those keys are merged in).
func (m *Mutex) parse(results []*api.TxnResult) view {
	var v view
	seen := make(map[string]bool, len(results))
	for _, r := range results {
		e := r.KV
		if e == nil {
			continue
		}
		if e.Key == m.lockKey { // the last answer about it is the latest
			v.lock = e
			continue
		}
		if seen[e.Key] {
			continue
		}
		seen[e.Key] = true
		id, isQueue := strings.CutPrefix(e.Key, m.queuePrefix)
		switch {
		case isQueue && id != "" && !strings.Contains(id, "/"):
			if e.Session == "" {
				v.dead = append(v.dead, e)
				continue
			}
			v.queue = append(v.queue, e)
			if e.Key == m.queueKey && e.Session == m.s.id {
				v.me = e
			}
		case strings.HasPrefix(e.Key, m.prefix):
			v.other = e.Key
		}
	}
	slices.SortFunc(v.queue, func(x, y *api.KVPair) int { return cmp.Compare(x.CreateIndex, y.CreateIndex) })
	return v
}

// successors returns the first two live entries of queue (sorted) other than
// ours: whom to hand the lock to.
func (m *Mutex) successors(queue []*api.KVPair) []waiter {
	var ws []waiter
	for _, e := range queue {
		if e.Key != m.queueKey && e.Session != "" && len(ws) < 2 {
			ws = append(ws, waiter{key: e.Key, session: e.Session, index: e.ModifyIndex})
		}
	}
	return ws
}

// named returns the waiter that lock's value (valueNext) names, if any.
func (m *Mutex) named(lock *api.KVPair) (waiter, bool) {
	rest, ok := strings.CutPrefix(string(lock.Value), valueNext)
	if !ok {
		return waiter{}, false
	}
	session, idx, ok := strings.Cut(rest, " ")
	index, err := strconv.ParseUint(idx, 10, 64)
	if !ok || err != nil || session == "" {
		return waiter{}, false
	}
	return waiter{key: m.queuePrefix + session, session: session, index: index}, true
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
// exists with flags other than a lock's (a semaphore's, say), or if keys of
// a longer name lie under "<name>/".
func (m *Mutex) compatible(v view) error {
	if v.lock != nil && v.lock.Flags != api.LockFlagValue {
		return fmt.Errorf("%w: %s has flags %#x, not a lock's %#x", holdfast.ErrConflict, m.lockKey, v.lock.Flags, uint64(api.LockFlagValue))
	}
	if v.other != "" {
		return fmt.Errorf("%w: %q is under %s/: a lock on %s would cover a lock of a longer name", holdfast.ErrConflict, v.other, m.name, m.name)
	}
	return nil
}
