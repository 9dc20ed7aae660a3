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
//     (or knows none).
//   - valueWaiter + "<token> <session> <index>": the head of the queue
//     announced itself (its queue entry: session and CreateIndex) after the
//     holder acquired the key with token (see announce); the write moved
//     the key's ModifyIndex, so the holder's Unlock reads the key and hands
//     the lock to that entry (see Grant.release).
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
	index        uint64 // the entry's ModifyIndex (= its CreateIndex)
}

// nextValue is the lock key's value when it is handed over to a holder whose
// known successor is the first of rest.
func nextValue(rest []waiter) []byte {
	if len(rest) == 0 {
		return []byte(valueNext)
	}
	return fmt.Appendf(nil, "%s%s %d", valueNext, rest[0].session, rest[0].index)
}

// HolderToken returns the fencing token of the grant that holds lock, a
// Mutex's or an Election's lock key (LockKey) as read from Consul: the
// ModifyIndex of the write that acquired it, which a waiter's announcement
// (a later write to the key that keeps its holder) carries in the value.
// For a key held by api.Lock or `consul lock`, it is the key's ModifyIndex.
func HolderToken(lock *api.KVPair) uint64 { return tokenOf(lock) }

// tokenOf returns the token of the grant behind lock: the ModifyIndex of the
// write that acquired it, which an announcement (valueWaiter) keeps in the
// value.
func tokenOf(lock *api.KVPair) uint64 {
	if v, ok := strings.CutPrefix(string(lock.Value), valueWaiter); ok {
		v, _, _ = strings.Cut(v, " ")
		if t, err := strconv.ParseUint(v, 10, 64); err == nil {
			return t
		}
	}
	return lock.ModifyIndex
}

// parseEntry parses "<session> <index>" as the queue entry of that session
// under m, with that CreateIndex.
func (m *Mutex) parseEntry(s string) (waiter, bool) {
	session, idx, ok := strings.Cut(s, " ")
	index, err := strconv.ParseUint(idx, 10, 64)
	if !ok || err != nil || session == "" || index == 0 || strings.Contains(session, "/") {
		return waiter{}, false
	}
	return waiter{key: m.queuePrefix + session, session: session, index: index}, true
}

// named returns the waiter that lock's value (valueNext) names, if any.
func (m *Mutex) named(lock *api.KVPair) (waiter, bool) {
	rest, ok := strings.CutPrefix(string(lock.Value), valueNext)
	if !ok {
		return waiter{}, false
	}
	return m.parseEntry(rest)
}

// announced returns the waiter that announced itself in lock's value
// (valueWaiter), if any.
func (m *Mutex) announced(lock *api.KVPair) (waiter, bool) {
	rest, ok := strings.CutPrefix(string(lock.Value), valueWaiter)
	if !ok {
		return waiter{}, false
	}
	_, entry, ok := strings.Cut(rest, " ")
	if !ok {
		return waiter{}, false
	}
	return m.parseEntry(entry)
}

// The tail key "<name>/.tail" names the queue entry created last:
// "<session>" (the entry's CreateIndex is the tail's ModifyIndex: both are
// written by the same transaction, see enqueue) or "<session> <index>"
// (written by a repair, see Session.repairTail). Queuing up is a cas on it,
// so entries are created one at a time and each new waiter learns its
// predecessor (the entry just ahead of it by CreateIndex) without reading
// the queue. It is absent only while nobody queues: it is deleted, guarded
// by its index, together with the last entry's departure (a handoff to
// it, the release of a holder it names, a repair that finds no live entry).
// An entry it names may be gone (handed the lock, left, dead): a waiter
// behind such an entry finds its place by reading the queue once.
const tailSuffix = "/.tail"

// tailEntry returns the entry that the tail key names (ok false if absent
// or unreadable).
func (m *Mutex) tailEntry(tail *api.KVPair) (waiter, bool) {
	if tail == nil || tail.ModifyIndex == 0 {
		return waiter{}, false
	}
	if w, ok := m.parseEntry(string(tail.Value)); ok {
		return w, true
	}
	return m.parseEntry(fmt.Sprintf("%s %d", tail.Value, tail.ModifyIndex))
}

// acquisition is one Lock or TryLock call in progress.
type acquisition struct {
	m   *Mutex
	how taking // how the lock key is taken: a Mutex's (lockTaking) or a campaign's (campaign.go)

	// left is set once something of ours may be in Consul: a queue key, or
	// the lock key (an acquire of unknown outcome, a handoff to us). On
	// failure, the session cleans it up (see Session.cleanUp).
	left bool
	// since is the CreateIndex of our first queue key: a lock key held by
	// our session through a write after it was handed to us. queueIndex is
	// the CreateIndex of our latest queue key.
	since, queueIndex uint64
	// pred is the queue entry just ahead of ours, as far as we know: the
	// one we wait for. It is nil at the head of the queue (or before we
	// queue); lost says that we do not know it (read the queue).
	pred *waiter
	lost bool
	// next is whom the grant hands the lock to on Unlock, as far as we know
	// when we get it: up to two waiters, in queue order. When we took the
	// lock with a read of the queue, tail is the tail key as it then was
	// (nil if absent), and alone says that no live waiter but us queued.
	next      []waiter
	tail      *api.KVPair
	tailKnown bool
	alone     bool

	// Lock-delay bookkeeping of the head of the queue: the session last seen
	// holding the lock key, its lock-delay (if known), and when the delay
	// that follows its release should be over.
	holder    string
	delay     time.Duration
	known     bool
	notBefore time.Time
}

// taking is what differs between the acquisitions that wait in the queue:
// a Mutex's Lock (lockTaking) and an Election's Campaign (campaign.go). The
// queue's steps below are the same for both.
type taking struct {
	// write returns the operations that take the lock key as seen (nil if
	// absent): a guard that it is still so, and the acquire with our value.
	write func(m *Mutex, seen *api.KVPair) api.TxnOps
	// handed accepts the lock key handed to us by the holder before us
	// (step 6) and returns the token.
	handed func(ctx context.Context, a *acquisition, lock *api.KVPair, queue []*api.KVPair) (uint64, error)
	// quiet says never to announce ourselves in the holder's lock key
	// (step 4): its value is not ours to rewrite.
	quiet bool
	// hold is the grant's releaser: what its Unlock does.
	hold func(m *Mutex, token uint64, a *acquisition) releaser
}

// lockTaking is a Mutex's: the lock key is acquired with valueTaken,
// guarded by its ModifyIndex; a handoff is accepted as it is; the grant
// hands the lock over on Unlock (lockHold).
var lockTaking = taking{
	write: func(m *Mutex, seen *api.KVPair) api.TxnOps {
		guard := kvOp(api.KVCheckNotExists, m.lockKey)
		if seen != nil {
			guard = checkIndex(m.lockKey, seen.ModifyIndex)
		}
		return api.TxnOps{guard, lockOp(m.lockKey, m.s.id, []byte(valueTaken))}
	},
	handed: func(ctx context.Context, a *acquisition, lock *api.KVPair, queue []*api.KVPair) (uint64, error) {
		return a.acceptHandoff(ctx, lock, queue)
	},
	hold: func(m *Mutex, token uint64, a *acquisition) releaser {
		return &lockHold{m: m, next: a.next, index: token,
			tail: a.tail, tailKnown: a.tailKnown, alone: a.alone, queued: a.queueIndex}
	},
}

// outcome is what an attempt to acquire the lock key came to.
type outcome int

const (
	taken   outcome = iota // we hold the lock key
	busy                   // another session holds it, or it changed since we read it
	delayed                // a lock-delay is in effect on it
)

// run is the waiting algorithm of a Mutex; it returns the fencing token.
// Its cost per acquisition does not depend on how many wait: no waiter
// reads the queue on its way to the lock unless an entry ahead of it left.
//
//  1. List the names under "<name>/" (keys with separator "/": the lock
//     key, the tail key, "<name>/.queue/", and any key of a longer name,
//     then fail with ErrConflict). If there is neither a lock key nor a
//     tail key, take the lock (step 6). (TryLock reads the whole subtree
//     instead, and takes the lock only if it is free and no live entry
//     queues, else fails with ErrLocked.)
//  2. Queue up, in one transaction: read the tail key and set it to our
//     session, create our queue key with our session, and read the lock
//     key. The entry the tail named is our predecessor: the one created
//     just before ours (see tailSuffix).
//  3. Wait for our predecessor's queue key to change (a blocking query),
//     then read the lock key. If our predecessor's session holds it, we are
//     the head of the queue (the handoff to it deleted its queue key).
//     Otherwise (it left or died, or took the lock and let it go) read the
//     subtree once: the live entry just ahead of ours by CreateIndex is our
//     predecessor, or none; dead entries are deleted (at most 64 per read).
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
// Every request is bounded by ctx: the caller's context, ended with the
// session. What a failed run leaves is removed by the caller (see left).
func (a *acquisition) run(ctx context.Context, try bool) (uint64, error) {
	m := a.m
	var lock *api.KVPair
	if try {
		v, err := a.read(ctx)
		if err != nil {
			return 0, err
		}
		if err := m.compatible(v); err != nil {
			return 0, err
		}
		if !free(v.lock) || len(v.queue) > 0 {
			return 0, fmt.Errorf("%w: %s is held or waited for", holdfast.ErrLocked, m.name)
		}
		lock = v.lock
	} else {
		names, err := a.list(ctx)
		if err != nil {
			return 0, err
		}
		if len(names) > 0 { // the lock key, the tail key, queue entries
			return a.queue(ctx)
		}
	}
	token, out, err := a.take(ctx, lock)
	switch {
	case err != nil:
		return 0, err
	case out == taken:
		return token, nil
	case try && out == delayed:
		return 0, fmt.Errorf("%w: %s is in its lock-delay after its holder's session ended", holdfast.ErrLocked, m.name)
	case try:
		return 0, fmt.Errorf("%w: %s is held or waited for", holdfast.ErrLocked, m.name)
	}
	// Another contender was faster, or a lock-delay is in effect: queue.
	return a.queue(ctx)
}

// queue runs steps 2 to 6.
func (a *acquisition) queue(ctx context.Context) (uint64, error) {
	lock, err := a.enqueue(ctx)
	if err != nil {
		return 0, err
	}
	return a.wait(ctx, lock)
}

// wait runs steps 3 to 6 from lock, the lock key as last read.
func (a *acquisition) wait(ctx context.Context, lock *api.KVPair) (uint64, error) {
	m := a.m
	var queue []*api.KVPair // the queue's live entries, if we read it
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := m.compatibleLock(lock); err != nil {
			return 0, err
		}
		if a.handedToUs(lock) {
			return a.how.handed(ctx, a, lock, queue)
		}
		if a.pred != nil && !a.lost {
			if _, err := a.watch(ctx, a.pred.key, a.pred.index); err != nil {
				return 0, err
			}
			var err error
			if lock, err = a.get(ctx, m.lockKey); err != nil {
				return 0, err
			}
			if lock != nil && lock.Session == a.pred.session && !a.handedToUs(lock) {
				a.pred = nil // the handoff to it deleted its queue key
				continue
			}
			a.lost = true
			continue
		}
		if a.lost {
			v, err := a.read(ctx)
			if err != nil {
				return 0, err
			}
			if err := m.compatible(v); err != nil {
				return 0, err
			}
			a.dropDead(ctx, v.dead)
			lock, queue, a.lost, a.pred = v.lock, v.queue, false, nil
			switch {
			case a.handedToUs(lock):
			case v.me == nil:
				// Our queue key vanished or lost its session. Queue up
				// again; if our session is gone, Consul says so.
				if lock, err = a.enqueue(ctx); err != nil {
					return 0, err
				}
			default:
				if p := v.predecessor(); p != nil {
					a.pred = &waiter{key: p.Key, session: p.Session, index: p.ModifyIndex}
				}
			}
			continue
		}
		// Head of the queue: nobody can queue ahead of us any more.
		if !free(lock) {
			var err error
			if a.mustAnnounce(lock) {
				lock, err = a.announce(ctx, lock)
			} else {
				lock, err = a.waitRelease(ctx, lock)
			}
			if err != nil {
				return 0, err
			}
			continue
		}
		token, out, err := a.take(ctx, lock)
		switch {
		case err != nil:
			return 0, err
		case out == taken:
			return token, nil
		case out == delayed:
			if !sleep(ctx, a.delayLeft()) {
				return 0, ctx.Err()
			}
		default: // busy: a foreign client took it, or it changed
			if lock, err = a.get(ctx, m.lockKey); err != nil {
				return 0, err
			}
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

// acceptHandoff takes the lock handed to us. The handoff deleted the queue
// key we had then; a queue key created after it (a re-queue that crossed
// the handoff) is deleted here. Whom we hand the lock to on Unlock: the
// waiter named in the lock's value, and those behind us in queue (our last
// read of the queue, if any).
func (a *acquisition) acceptHandoff(ctx context.Context, lock *api.KVPair, queue []*api.KVPair) (uint64, error) {
	token := tokenOf(lock)
	if a.queueIndex > token {
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		defer cancel()
		if _, err := a.m.s.txn(rctx, api.TxnOps{kvOp(api.KVDelete, a.m.queueKey)}); err != nil {
			return 0, err // the cleanup releases the lock and deletes the key
		}
	}
	known := slices.Clone(queue)
	if w, ok := a.m.named(lock); ok {
		known = append(known, &api.KVPair{Key: w.key, Session: w.session, ModifyIndex: w.index, CreateIndex: w.index})
	}
	slices.SortFunc(known, func(x, y *api.KVPair) int { return cmp.Compare(x.CreateIndex, y.CreateIndex) })
	a.next = a.m.successors(slices.CompactFunc(known, func(x, y *api.KVPair) bool { return x.Key == y.Key }))
	return token, nil
}

// mustAnnounce reports whether the holder of lock (not us), a holdfast
// holder, may not know of our queue entry, and so would not hand us the
// lock on Unlock (see the lock values above).
func (a *acquisition) mustAnnounce(lock *api.KVPair) bool {
	val := string(lock.Value)
	me := func(w waiter, ok bool) bool { return ok && w.session == a.m.s.id && w.index == a.queueIndex }
	switch {
	case a.how.quiet:
		return false
	case val == valueTaken:
		return a.queueIndex > lock.ModifyIndex
	case strings.HasPrefix(val, valueNext):
		return !me(a.m.named(lock))
	case strings.HasPrefix(val, valueWaiter):
		// Another announcement: a waiter ahead of us that has left since.
		return !me(a.m.announced(lock))
	default: // a foreign holder
		return false
	}
}

// announce tells the holder of lock that we wait: a cas on the lock key at
// the index we saw, with the same flags and as its value the holder's token
// and our queue entry. A write that is not an acquire keeps the key's
// session, so the holder still holds it; but its Unlock, whose fast path is
// guarded by the key's ModifyIndex being its token, now reads the key and
// hands the lock to us. It returns the lock key as it then is.
func (a *acquisition) announce(ctx context.Context, lock *api.KVPair) (*api.KVPair, error) {
	m := a.m
	value := fmt.Appendf(nil, "%s%d %s %d", valueWaiter, tokenOf(lock), m.s.id, a.queueIndex)
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: m.lockKey, Index: lock.ModifyIndex, Flags: lock.Flags, Value: value}}}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := m.s.txn(rctx, ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.denied():
		return nil, txnError("announce on "+m.lockKey, rb)
	case rb != nil: // the key changed meanwhile: see how it is now
		return a.get(ctx, m.lockKey)
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
func (a *acquisition) waitRelease(ctx context.Context, lock *api.KVPair) (*api.KVPair, error) {
	if lock.Session != a.holder {
		a.holder = lock.Session
		a.delay, a.known = a.m.s.lockDelayOf(ctx, lock.Session)
	}
	next, err := a.watch(ctx, a.m.lockKey, lock.ModifyIndex)
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
func (a *acquisition) take(ctx context.Context, seen *api.KVPair) (uint64, outcome, error) {
	m := a.m
	ops := a.how.write(m, seen)
	if a.queueIndex != 0 {
		ops = append(ops, kvOp(api.KVDelete, m.queueKey))
	}
	ops = append(ops, kvOp(api.KVGetTree, m.prefix))
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	a.left = true // until we know the outcome
	resp, err := m.s.txn(rctx, ops)
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
	a.tail, a.tailKnown, a.alone = v.tail, true, len(a.next) == 0
	return v.lock.ModifyIndex, taken, nil
}

// enqueue creates our queue key (step 2) and returns the lock key read in
// the same transaction, which also reads the tail key and sets it to us:
// the entry it named is our predecessor. A leftover queue key of ours is
// replaced, so that our place is always at the back.
func (a *acquisition) enqueue(ctx context.Context) (*api.KVPair, error) {
	m := a.m
	ops := api.TxnOps{
		kvOp(api.KVGetOrEmpty, m.tailKey),
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: m.tailKey, Value: []byte(m.s.id)}},
		kvOp(api.KVDelete, m.queueKey),
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.queueKey, Session: m.s.id}},
		kvOp(api.KVGetOrEmpty, m.lockKey),
	}
	a.left = true
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := m.s.txn(rctx, ops)
	var rb *rollback
	switch {
	case err == nil:
	case errors.As(err, &rb) && rb.denied():
		return nil, txnError("queue up on "+m.name, rb)
	case rb != nil && (rb.sessionGone() || rb.lockDelayed()):
		// Our own queue key can only be in a lock-delay if our session was
		// invalidated.
		return nil, m.s.ended()
	case rb != nil:
		return nil, txnError("queue up on "+m.name, rb)
	default:
		return nil, err
	}
	var tail, me, lock *api.KVPair
	for _, r := range resp.Results {
		switch e := r.KV; {
		case e == nil:
		case e.Key == m.tailKey && tail == nil:
			tail = e // the first answer about it: its value before ours
		case e.Key == m.queueKey && e.Session == m.s.id:
			me = e
		case e.Key == m.lockKey && e.ModifyIndex != 0:
			lock = e
		}
	}
	if me == nil {
		return nil, errors.New("holdfast/consul: queue up: Consul's answer has no queue entry of ours")
	}
	a.queueIndex = me.CreateIndex
	if a.since == 0 {
		a.since = me.CreateIndex
	}
	a.pred, a.lost = nil, false
	if p, ok := m.tailEntry(tail); ok {
		a.pred = &p
		// Our own earlier entry (it was replaced): we do not know who
		// queued before it.
		a.lost = p.session == m.s.id
	} else if tail != nil && tail.ModifyIndex != 0 {
		a.lost = true // a tail we cannot read
	}
	return lock, nil
}

// list returns the names right under "<name>/" (the keys with separator
// "/": "<name>/.queue/" stands for the whole queue), and fails with
// ErrConflict if one is not the lock's own.
func (a *acquisition) list(ctx context.Context) ([]string, error) {
	m := a.m
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	names, _, err := m.s.client.KV().Keys(m.prefix, "/", (&api.QueryOptions{}).WithContext(rctx))
	if err != nil {
		return nil, apiError("list "+m.prefix, err)
	}
	for _, k := range names {
		if k != m.lockKey && k != m.tailKey && k != m.queuePrefix {
			return nil, fmt.Errorf("%w: %q is under %s/: a lock on %s would cover a lock of a longer name", holdfast.ErrConflict, k, m.name, m.name)
		}
	}
	return names, nil
}

// read returns the subtree of the lock, in one read-only transaction.
func (a *acquisition) read(ctx context.Context) (view, error) {
	m := a.m
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := m.s.txn(rctx, api.TxnOps{kvOp(api.KVGetTree, m.prefix)})
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
func (a *acquisition) get(ctx context.Context, key string) (*api.KVPair, error) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	pair, _, err := a.m.s.client.KV().Get(key, (&api.QueryOptions{}).WithContext(rctx))
	if err != nil {
		return nil, apiError("read "+key, err)
	}
	return pair, nil
}

// watch blocks until key's ModifyIndex is no longer index (it changed or is
// gone), and returns the key as it then is (nil if gone); see
// Session.watchKey.
func (a *acquisition) watch(ctx context.Context, key string, index uint64) (*api.KVPair, error) {
	return a.m.s.watchKey(ctx, key, index, 0)
}

// dropDead deletes queue entries whose session is gone; see
// Session.dropDead.
func (a *acquisition) dropDead(ctx context.Context, dead []*api.KVPair) { a.m.s.dropDead(ctx, dead) }

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
	tail  *api.KVPair   // the tail key, if present
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
		if e.Key == m.tailKey {
			v.tail = e
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
	if err := m.compatibleLock(v.lock); err != nil {
		return err
	}
	if v.other != "" {
		return fmt.Errorf("%w: %q is under %s/: a lock on %s would cover a lock of a longer name", holdfast.ErrConflict, v.other, m.name, m.name)
	}
	return nil
}

// compatibleLock returns an error wrapping holdfast.ErrConflict if the lock
// key exists with flags other than a lock's (a semaphore's, say).
func (m *Mutex) compatibleLock(lock *api.KVPair) error {
	if lock != nil && lock.Flags != api.LockFlagValue {
		return fmt.Errorf("%w: %s has flags %#x, not a lock's %#x", holdfast.ErrConflict, m.lockKey, lock.Flags, uint64(api.LockFlagValue))
	}
	return nil
}

// lockHold is a Mutex grant's release state. Used only by the release,
// which runs once, in one goroutine: whom to hand the lock to (up to two
// waiters, in queue order), and the lock key's ModifyIndex as we last saw
// it; the tail key as we last read it (nil if absent; tailKnown: read at
// all), and whether that read showed no live waiter behind us (alone); the
// CreateIndex of our last queue entry, if we queued.
type lockHold struct {
	m         *Mutex
	next      []waiter
	index     uint64
	tail      *api.KVPair
	tailKnown bool
	alone     bool
	queued    uint64
}

// errStale means that the lock key or the waiter we meant to hand it to
// changed since we last read them: read the queue again.
var errStale = errors.New("the lock key or its next waiter changed")

// announceWait bounds how long a release waits for a waiter that queued
// behind the holder to announce itself (see Grant.look), before it reads
// the whole queue instead.
const announceWait = 250 * time.Millisecond

// release ends a Mutex's grant in Consul; the session runs it in the
// background (see core.Grant), retried on transport errors while the
// session lives.
// After Unlock it hands the lock over (see handOver) or deletes the key.
// When the grant does not know whom to hand it to, or that nobody waits,
// or the key changed since (a waiter announced itself), it first reads the
// lock key and the tail key (see look), and the whole queue only if that
// does not tell. After a loss it deletes the key if our session still holds
// it (see Session.releaseKey).
func (g *lockHold) release(ctx context.Context, gr *Grant) error {
	if !errors.Is(context.Cause(gr.Context()), holdfast.ErrReleased) {
		return releasePlain(ctx, g.m, g.queued) // a lost grant
	}
	err := errStale
	if len(g.next) > 0 || g.tailKnown && g.alone {
		err = g.handOver(ctx)
	}
	for i := 0; i < 4 && errors.Is(err, errStale); i++ {
		if i < 2 {
			err = g.look(ctx)
		} else {
			err = g.refresh(ctx)
		}
		if err == nil {
			err = g.handOver(ctx)
		}
	}
	if errors.Is(err, holdfast.ErrNotHeld) {
		g.m.s.checkSoon()
	}
	return err // errStale four times over: retried
}

// drop releases the lock key as the session closes (see releaser).
func (g *lockHold) drop(ctx context.Context, _ *Grant) error {
	return g.m.s.releaseKey(ctx, g.m.lockKey)
}

// handOver, the write behind Unlock, hands the lock to the first waiter we
// know of, or deletes the key if we know that nobody waits, in one
// transaction:
//
//   - with a waiter w: [check-session of the lock key on our session,
//     unlock it, lock it for w's session with the value naming the waiter
//     after w, check-session of w's queue key on w's session, delete-cas of
//     w's queue key at the index we saw, and if the tail key names w, a
//     delete-cas of it]: w's acquisition sees the key held by its session
//     and takes the grant, with the ModifyIndex of this write as its token;
//   - with none: [check-session, check-index of the lock key at g.index
//     (our token, unless we have read the key since), check that the tail
//     key is as we read it (absent, or a delete-cas), delete the lock key]:
//     a waiter that queued after our read moved the tail key, and one that
//     queued after we acquired the key has announced itself with a write to
//     the key (see acquisition.announce), so a check fails then.
//
// A failed check-session is an error wrapping holdfast.ErrNotHeld; any
// other failed check is errStale.
func (g *lockHold) handOver(ctx context.Context) error {
	s, m, key := g.m.s, g.m, g.m.lockKey
	ops := releaseGuard(key, s.id)
	held := len(ops) // ops before this index check that we hold the key
	switch {
	case len(g.next) > 0:
		w := g.next[0]
		ops = append(ops,
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: key, Flags: api.LockFlagValue, Session: s.id}},
			lockOp(key, w.session, nextValue(g.next[1:])))
		ops = append(append(ops, nextGuard(w)...), kvOp(api.KVDelete, w.key))
		if t, ok := m.tailEntry(g.tail); ok && g.tailKnown && t == w {
			ops = append(ops, deleteCAS(m.tailKey, g.tail.ModifyIndex)) // w was the last to queue
		}
	case !g.tailKnown || !g.alone:
		return errStale // we do not know that nobody waits
	default:
		ops = append(ops, checkIndex(key, g.index))
		if g.tail == nil {
			ops = append(ops, kvOp(api.KVCheckNotExists, m.tailKey))
		} else {
			ops = append(ops, deleteCAS(m.tailKey, g.tail.ModifyIndex))
		}
		ops = append(ops, kvOp(api.KVDelete, key))
	}
	_, err := s.txn(ctx, ops)
	var rb *rollback
	switch {
	case err == nil:
		return nil
	case errors.As(err, &rb) && rb.denied():
		return txnError("unlock "+key, rb)
	case rb != nil && (rb.failedBefore(held) || len(g.next) > 0 && rb.failed(held)):
		// Our check-session, or the unlock (which checks our session too).
		return fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, key, s.id)
	case rb != nil:
		g.tailKnown = false
		return errStale
	default:
		return err
	}
}

// look reads the lock key and the tail key, in one read-only transaction:
// whom to hand the lock to now (the waiter that announced itself in the
// lock key's value), and whether anybody queued behind us (the tail key
// names an entry other than ours). When somebody did but has not announced
// itself yet, it waits (a blocking query on the lock key) up to announceWait
// for that, and then reads the whole queue (see refresh). It returns an
// error wrapping holdfast.ErrNotHeld if our session no longer holds the
// key.
func (g *lockHold) look(ctx context.Context) error {
	m := g.m
	for waited := false; ; waited = true {
		resp, err := m.s.txn(ctx, api.TxnOps{kvOp(api.KVGetOrEmpty, m.lockKey), kvOp(api.KVGetOrEmpty, m.tailKey)})
		var rb *rollback
		switch {
		case errors.As(err, &rb):
			return txnError("read "+m.lockKey, rb)
		case err != nil:
			return err
		}
		var lock, tail *api.KVPair
		for _, r := range resp.Results {
			switch e := r.KV; {
			case e == nil || e.ModifyIndex == 0:
			case e.Key == m.lockKey:
				lock = e
			case e.Key == m.tailKey:
				tail = e
			}
		}
		if lock == nil || lock.Session != m.s.id {
			return fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, m.lockKey, m.s.id)
		}
		g.index, g.tail, g.tailKnown, g.next = lock.ModifyIndex, tail, true, nil
		if w, ok := m.announced(lock); ok && w.session != m.s.id {
			g.next = []waiter{w}
			return nil
		}
		t, ok := m.tailEntry(tail)
		if g.alone = !ok || t.session == m.s.id && t.index == g.queued; g.alone {
			return nil
		}
		// Somebody queued behind us: it announces itself once it sees that
		// we hold the lock, unless it knows that we know of it: we took the
		// free key after it queued (reading the queue), or the value names
		// it. Then, or if it does not announce itself, read the queue.
		if w, ok := m.named(lock); waited || string(lock.Value) == valueTaken && t.index < g.index || ok && w == t {
			return g.refresh(ctx)
		}
		now, err := m.s.watchKey(ctx, m.lockKey, lock.ModifyIndex, announceWait)
		if err != nil {
			return err
		}
		if now == nil {
			return g.refresh(ctx) // no announcement, or the key is gone
		}
	}
}

// refresh reads the lock key and the queue: whom to hand the lock to now,
// and the key's current index. It deletes dead entries it finds (at most 64
// at a time). It returns an error wrapping holdfast.ErrNotHeld if our
// session no longer holds the key.
func (g *lockHold) refresh(ctx context.Context) error {
	m := g.m
	resp, err := m.s.txn(ctx, api.TxnOps{kvOp(api.KVGetTree, m.prefix)})
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return txnError("read "+m.name, rb)
	case err != nil:
		return err
	}
	v := m.parse(resp.Results)
	if v.lock == nil || v.lock.Session != m.s.id {
		return fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, m.lockKey, m.s.id)
	}
	m.s.dropDead(ctx, v.dead)
	g.index = v.lock.ModifyIndex
	g.next = m.successors(v.queue)
	g.tail, g.tailKnown, g.alone = v.tail, true, len(g.next) == 0
	return nil
}

// releasePlain releases m's lock key without handing it over (an
// election's grant, a lost grant): [check-session, delete] of the lock key
// (see Session.releaseKey), which reads the tail key too; if the tail key
// names our own last queue entry (CreateIndex queued: nobody queued after
// us), it is deleted, if unchanged.
func releasePlain(ctx context.Context, m *Mutex, queued uint64) error {
	s := m.s
	ops := append(releaseGuard(m.lockKey, s.id), kvOp(api.KVDelete, m.lockKey), kvOp(api.KVGetOrEmpty, m.tailKey))
	resp, err := s.txn(ctx, ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.denied():
		return txnError("release "+m.lockKey, rb)
	case rb != nil:
		return fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, m.lockKey, s.id)
	case err != nil:
		return err
	}
	for _, r := range resp.Results {
		if e := r.KV; e != nil && e.Key == m.tailKey {
			if t, ok := m.tailEntry(e); ok && t.session == s.id && t.index == queued {
				_, _ = s.txn(ctx, api.TxnOps{deleteCAS(m.tailKey, e.ModifyIndex)})
			}
		}
	}
	return nil
}
