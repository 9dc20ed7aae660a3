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
	"github.com/holdfast/holdfast/internal/core"
)

const (
	// delayRetry and delayRetryMax bound the pauses of the head of the
	// queue between its retries while a lock-delay of unknown end is in
	// effect, or once the expected end has passed: they double from
	// delayRetry to delayRetryMax (before, every 25 ms: about 600
	// requests over a 15 s lock-delay).
	delayRetry    = 25 * time.Millisecond
	delayRetryMax = 500 * time.Millisecond
	// maxDropDead bounds how many stale queue entries one request removes.
	maxDropDead = 64
	// linkWait bounds how long a release waits for a waiter that queued
	// behind the holder to link itself (see lockHold.look), before it reads
	// the whole queue instead.
	linkWait = 250 * time.Millisecond
)

// valueTaken is the lock key's value while a holdfast Mutex holds it.
// Foreign holders (api.Lock, `consul lock`) write other values.
const valueTaken = "holdfast"

// The queue (docs/DESIGN.md, "Consul acquire"): each contender's entry
// "<name>/.queue/<session>", acquired with its session, lives from the
// moment it queues until its grant ends (the holder's entry stays while it
// holds). Under an entry E of session S:
//
//   - E + nextInfix + W: the link of the waiter W right behind E, written by
//     W and acquired with W's session (value: W's entry's CreateIndex), so
//     that S knows whom to hand the lock to without a read;
//   - E + prevInfix + P: S's anchor on its predecessor P, written by S and
//     acquired with P's session: it goes when P's session ends, or is
//     deleted when P leaves the queue, which wakes S;
//   - E + heldSuffix: written by the handoff that grants S the lock, in the
//     same transaction (its ModifyIndex is the token).
//
// A waiter blocks on its own entry's subtree only: one notification tells
// it its grant, its successor, or its predecessor's end.
const (
	nextInfix  = "/next/"
	prevInfix  = "/prev/"
	heldSuffix = "/held"
)

// waiter is a queue entry the lock can be handed to.
type waiter struct {
	key, session string
	index        uint64 // the entry's CreateIndex (= its ModifyIndex)
}

// entry returns the queue entry of session with that CreateIndex.
func (m *Mutex) entry(session string, index uint64) waiter {
	return waiter{key: m.queuePrefix + session, session: session, index: index}
}

// HolderToken returns the fencing token of the grant that holds lock, a
// Mutex's or an Election's lock key (LockKey) as read from Consul: the
// ModifyIndex of the write that acquired it (a later write by the holder,
// such as a poke, moves it). For a key held by api.Lock or `consul lock`,
// it is the key's ModifyIndex too.
func HolderToken(lock *api.KVPair) uint64 { return tokenOf(lock) }

// tokenOf returns the token of the grant behind lock (see HolderToken).
func tokenOf(lock *api.KVPair) uint64 { return lock.ModifyIndex }

// parseEntry parses "<session> <index>" as the queue entry of that session
// under m, with that CreateIndex.
func (m *Mutex) parseEntry(s string) (waiter, bool) {
	session, idx, ok := strings.Cut(s, " ")
	index, err := strconv.ParseUint(idx, 10, 64)
	if !ok || err != nil || session == "" || index == 0 || strings.Contains(session, "/") {
		return waiter{}, false
	}
	return m.entry(session, index), true
}

// The tail key "<name>/.tail" names the queue entry created last:
// "<session>" (the entry's CreateIndex is the tail's ModifyIndex: both are
// written by the same transaction, see enqueue) or "<session> <index>"
// (written by a repair, see Mutex.repairTail, or a re-lock, see
// Mutex.relockTail). Queuing up sets it and reads
// what it was in one transaction, so entries are created one at a time and
// each new waiter learns its predecessor without reading the queue. It is
// absent only while nobody queues or holds through the queue: it is
// deleted, guarded by its index, with the last entry (a release that finds
// nobody behind it, a repair that finds no live entry).
//
// The tail key is acquired with the session of the entry it names (a
// delete then a lock, in the transaction that writes it), so that Consul
// deletes it with that session's other keys when it invalidates the
// session (Behavior delete): a contender cut off for good leaves no tail
// naming it. While a lock-delay is in effect on the tail key (its last
// holder's session was invalidated), it is written plain instead (see
// tailOps), and acquired once the delay ends (see relockTail); a reader
// treats both alike.
const tailSuffix = "/.tail"

// tailOps returns the operations that point the tail key at an entry of
// session, with value: delete it, then acquire it with session (plain: set
// it, with no session, for when a lock-delay refuses the acquire).
func (m *Mutex) tailOps(session string, value []byte, plain bool) api.TxnOps {
	write := &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.tailKey, Session: session, Value: value}}
	if plain {
		write = &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVSet, Key: m.tailKey, Value: value}}
	}
	return api.TxnOps{kvOp(api.KVDelete, m.tailKey), write}
}

// relockTail acquires the tail key, written plain at index (see tailOps),
// with session once the lock-delay that refused that ends, naming the
// entry of session with CreateIndex entry explicitly (its ModifyIndex moves),
// so that the key goes with that session: a plain tail key would outlive
// every session (before: TestPlainTailLeftover). It runs in the session's
// background, retried while the lock-delay lasts (core.Backoff, pauses up
// to delayRetryMax), and stops once the tail key changed (somebody queued,
// a release or a repair moved it), the session named ended, or ours did.
//
// A grant taken while our own tail key is still plain tries once more at
// once (see acquisition.plainTail), so that a holder cut off right after
// its grant leaves nothing either.
func (m *Mutex) relockTail(session string, entry, index uint64) {
	m.s.bg.Go(func(ctx context.Context) {
		_ = core.Backoff{Attempt: requestTimeout, First: delayRetry, Max: delayRetryMax}.Retry(ctx, func(ctx context.Context) error {
			_, err := m.relockTailOnce(ctx, session, entry, index)
			return err
		})
	})
}

// relockTailOnce is one attempt of relockTail; it returns the tail key's
// new ModifyIndex (0: not acquired), and an error only if the lock-delay
// still refuses it or the request failed.
func (m *Mutex) relockTailOnce(ctx context.Context, session string, entry, index uint64) (uint64, error) {
	resp, err := m.s.txn(ctx, api.TxnOps{checkIndex(m.tailKey, index),
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.tailKey, Session: session, Value: fmt.Appendf(nil, "%s %d", session, entry)}}})
	var rb *rollback
	switch {
	case errors.As(err, &rb) && !rb.delayedOnly(1):
		return 0, nil // it changed, or the session ended: nothing to do
	case err != nil:
		return 0, err
	}
	var at uint64
	for _, r := range resp.Results {
		if r.KV != nil && r.KV.Key == m.tailKey {
			at = max(at, r.KV.ModifyIndex)
		}
	}
	return at, nil
}

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

	// left is set once something of ours may be in Consul: a queue entry,
	// or the lock key (an acquire of unknown outcome, a handoff to us). On
	// failure, the session cleans it up (see Session.cleanUp).
	left bool
	// uncertain is set once a write of ours got no answer: it may land
	// after the cleanup (see Session.sweepLater).
	uncertain bool
	// since is the CreateIndex of our first queue entry: a lock key held by
	// our session through a write after it was handed to us. queueIndex is
	// the CreateIndex of our latest entry, and tailIndex the tail key's
	// ModifyIndex as we set it (0: not set by us).
	since, queueIndex, tailIndex uint64
	// pred is the entry just ahead of ours, as far as we know: nil at the
	// head of the queue (or before we queue). linked says that our link to
	// it and our anchor on it are written; lost that we do not know it
	// (read the queue).
	pred   *waiter
	linked bool
	lost   bool
	// mine is the index of our entry's subtree as we last saw it (the
	// blocking queries on it start there), and next the waiter linked right
	// behind us, if any: whom the grant hands the lock to.
	mine uint64
	next *waiter

	// Lock-delay bookkeeping: the session last seen holding the lock key
	// (or our predecessor's, which may hold it next), its lock-delay (if
	// known), and when the delay that follows its release should be over;
	// guess says that this end is our predecessor's delay, which applies
	// only if it held the lock last (see delayLeft). pause is the next
	// pause between retries of an unknown end.
	holder    string
	delay     time.Duration
	known     bool
	notBefore time.Time
	guess     bool
	pause     time.Duration
	// plainTail says that we wrote the tail key plain (see relockTail).
	plainTail bool
}

// taking is what differs between the acquisitions that wait in the queue:
// a Mutex's Lock (lockTaking) and an Election's Campaign (campaign.go). The
// queue's steps below are the same for both.
type taking struct {
	// write returns the operations that take the lock key as seen (nil if
	// absent): a guard that it is still so, and the acquire with our value.
	write func(m *Mutex, seen *api.KVPair) api.TxnOps
	// handed accepts the lock key handed to us with token by the holder
	// before us (step 5) and returns the grant's token.
	handed func(ctx context.Context, a *acquisition, token uint64) (uint64, error)
	// resign says that the grant never hands the lock key over: its release
	// deletes it and wakes the next waiter, which takes it (see lockHold).
	resign bool
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
	handed: func(_ context.Context, _ *acquisition, token uint64) (uint64, error) { return token, nil },
}

// hold returns the grant's releaser: what its Unlock does.
func (a *acquisition) hold(token uint64) releaser {
	return &lockHold{m: a.m, resign: a.how.resign, next: a.next, token: token,
		queueIndex: a.queueIndex, tailIndex: a.tailIndex, mine: a.mine}
}

// outcome is what an attempt to acquire the lock key came to.
type outcome int

const (
	taken   outcome = iota // we hold the lock key
	busy                   // another session holds it, or it changed since we read it
	delayed                // a lock-delay is in effect on it
)

// run is the waiting algorithm of a Mutex (docs/DESIGN.md, "Consul
// acquire"); it returns the fencing token. No waiter reads the queue on
// its way to the lock unless an entry ahead of it left or died.
//
//  1. List the names under "<name>/". Nothing there: take the lock, and
//     create our entry and the tail key naming it, in one transaction
//     guarded by both keys being absent. (TryLock reads the subtree, and
//     takes the lock only if it is free and no live entry queues.)
//  2. Queue up, in one transaction: read the tail key and set it to us,
//     create our entry, read the lock key. The entry the tail named is our
//     predecessor; none: we are the head.
//  3. Link: one transaction, guarded by our predecessor's entry being
//     unchanged, writes our link under its entry and our anchor (acquired
//     with its session) under ours. If it fails, read the queue: the live
//     entry just ahead of ours is our predecessor (none: the head).
//  4. Block on our entry's subtree. A link behind us: note it (whom we
//     hand to), block again. Our anchor gone: step 3 with a read.
//  5. The held mark under our entry: the lock was handed to us, by the
//     transaction that wrote the mark (its ModifyIndex is the token).
//  6. At the head: wait for the lock key to be free (a blocking query),
//     then take it, guarded by the key being as seen, reading our subtree
//     (whom to hand to) in the same transaction. A lock-delay refusal is
//     retried when the delay ends.
//
// Every request is bounded by ctx: the caller's context, ended with the
// session. What a failed run leaves is removed by the caller (see left).
func (a *acquisition) run(ctx context.Context, try bool) (uint64, error) {
	m := a.m
	var lock, tail *api.KVPair
	if try {
		v, err := a.read(ctx)
		if err != nil {
			return 0, err
		}
		if err := m.deadLock(ctx, v.lock); err != nil {
			return 0, err
		}
		if err := m.compatible(v); err != nil {
			return 0, err
		}
		m.s.dropDead(ctx, v.dead) // else nobody may read them again: left for good
		if !free(v.lock) || v.waiting() > 0 {
			return 0, fmt.Errorf("%w: %s is held or waited for", holdfast.ErrLocked, m.name)
		}
		lock, tail = v.lock, v.tail
	} else {
		names, err := a.list(ctx)
		if err != nil {
			return 0, err
		}
		if len(names) > 0 { // the lock key, the tail key, queue entries
			return a.queue(ctx)
		}
	}
	token, out, err := a.take(ctx, lock, tail, true)
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
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if a.handedToUs(lock) {
			return a.how.handed(ctx, a, tokenOf(lock))
		}
		switch {
		case a.lost:
			var drop api.TxnOps // our link under the predecessor we leave
			if a.pred != nil && a.linked {
				drop = api.TxnOps{kvOp(api.KVDelete, a.pred.key+nextInfix+m.s.id)}
			}
			v, err := a.read(ctx, drop...)
			if err != nil {
				return 0, err
			}
			if err := m.compatible(v); err != nil {
				return 0, err
			}
			m.s.dropDead(ctx, v.dead)
			lock, a.lost, a.pred, a.linked = v.lock, false, nil, false
			switch {
			case a.handedToUs(lock):
			case v.me == nil || v.me.CreateIndex != a.queueIndex:
				// Our entry vanished or lost its session. Queue up again; if
				// our session is gone, Consul says so.
				if lock, err = a.enqueue(ctx); err != nil {
					return 0, err
				}
			default:
				a.next = v.next
				if p := v.predecessor(); p != nil {
					w := m.entry(p.Session, p.CreateIndex)
					a.pred = &w
				}
			}
			continue
		case a.pred != nil && !a.linked:
			if err := a.link(ctx); err != nil {
				return 0, err
			}
			continue
		case a.pred != nil:
			v, err := a.watchMine(ctx)
			if err != nil {
				return 0, err
			}
			if v.next != nil {
				a.next = v.next
			}
			switch {
			case v.me == nil || v.me.CreateIndex != a.queueIndex:
				a.lost = true
			case v.held != nil && v.held.ModifyIndex > a.since:
				return a.how.handed(ctx, a, v.held.ModifyIndex)
			case v.anchor == nil || v.anchor.Session != a.pred.session:
				// Our predecessor left, or its session ended (then it may
				// have held the lock: its lock-delay applies from now).
				a.notBefore, a.guess, a.pause = time.Time{}, false, 0
				if v.anchor != nil && a.known && a.holder == a.pred.session {
					a.notBefore = time.Now().Add(a.delay)
				}
				a.lost = true
			}
			continue
		}
		// Head of the queue: nobody can queue ahead of us any more.
		if !free(lock) {
			var err error
			if lock, err = a.waitRelease(ctx, lock); err != nil {
				return 0, err
			}
			continue
		}
		if err := m.deadLock(ctx, lock); err != nil {
			return 0, err
		}
		token, out, err := a.take(ctx, lock, nil, false)
		switch {
		case err != nil:
			return 0, err
		case out == taken:
			return token, nil
		case out == delayed:
			if a.notBefore.IsZero() && a.known {
				// Our predecessor's anchor was deleted, not freed (Behavior
				// delete): it died, or it left and another holder did. If it
				// held the lock last, its delay started at most now.
				a.notBefore, a.guess = time.Now().Add(a.delay), true
			}
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

// send sends one of the acquisition's writes. One that got no answer
// marks the acquisition uncertain: it may still be applied after our
// cleanup has run (see Session.sweepLater).
func (a *acquisition) send(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	resp, err := a.m.s.txn(ctx, ops)
	var rb *rollback
	if err != nil && !errors.As(err, &rb) {
		a.uncertain = true
	}
	return resp, err
}

// link writes our link under our predecessor's entry and our anchor on it
// under ours (step 3), in one transaction guarded by its entry being
// unchanged; the anchor is acquired with its session, so that Consul
// deletes or frees it when that session ends. If the transaction fails
// (the entry went, its session ended), we read the queue next.
func (a *acquisition) link(ctx context.Context) error {
	m, p := a.m, a.pred
	ops := api.TxnOps{
		checkIndex(p.key, p.index),
		{KV: &api.KVTxnOp{Verb: api.KVGet, Key: p.key}}, // a check's answer carries no value
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: p.key + nextInfix + m.s.id, Session: m.s.id, Value: strconv.AppendUint(nil, a.queueIndex, 10)}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.queueKey + prevInfix + p.session, Session: p.session}},
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := a.send(rctx, ops)
	var rb *rollback
	switch {
	case err == nil:
	case errors.As(err, &rb) && rb.denied():
		return txnError("queue up on "+m.name, rb)
	case rb != nil:
		a.lost = true
		return nil
	default:
		return err
	}
	a.holder, a.known = p.session, false
	for _, r := range resp.Results {
		switch e := r.KV; {
		case e == nil:
		case e.Key == p.key: // the check's answer, then the get's: its value is its lock-delay
			if d, ok := entryDelay(e); ok {
				a.delay, a.known = d, true
			}
		default:
			a.mine = max(a.mine, e.ModifyIndex)
		}
	}
	a.linked = true
	return nil
}

// entryValue is the value of our queue entry: our session's lock-delay in
// milliseconds, so that the waiter behind us knows it (it may hold the lock
// before that waiter, and if its session ends then, the delay applies).
func (m *Mutex) entryValue() []byte {
	return strconv.AppendInt(nil, m.s.cfg.lockDelay.Milliseconds(), 10)
}

// entryDelay returns the lock-delay that entry e's value states.
func entryDelay(e *api.KVPair) (time.Duration, bool) {
	ms, err := strconv.ParseInt(string(e.Value), 10, 64)
	if err != nil || ms < 0 {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// watchMine blocks until our entry's subtree changes (it was last seen at
// a.mine), and returns it (see Session.watchTree).
func (a *acquisition) watchMine(ctx context.Context) (view, error) {
	pairs, index, err := a.m.s.watchTree(ctx, a.m.queueKey, a.mine, 0)
	if err != nil {
		return view{}, err
	}
	a.mine = index
	results := make([]*api.TxnResult, 0, len(pairs))
	for _, p := range pairs {
		results = append(results, &api.TxnResult{KV: p})
	}
	v := a.m.parse(results)
	if v.anchor != nil && a.pred != nil && !strings.HasSuffix(v.anchor.Key, prevInfix+a.pred.session) {
		v.anchor = nil
	}
	return v, nil
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
	next, err := a.m.s.watchKey(ctx, a.m.lockKey, lock.ModifyIndex, 0)
	if err != nil {
		return nil, err
	}
	if free(next) {
		a.notBefore, a.guess, a.pause = time.Time{}, false, 0
		if a.known {
			a.notBefore = time.Now().Add(a.delay)
		}
	}
	return next, nil
}

// delayLeft is how long to wait after a lock-delay refusal: until the end
// of the delay of the holder we saw release the lock (see waitRelease);
// else, or once that end has passed, a pause that doubles from delayRetry
// to delayRetryMax (a bounded rate of retries), shortened to end at our
// predecessor's delay's end if that is a guess still ahead. A guess is not
// waited out whole: the session that held the lock last may be another
// one, with a shorter delay (before, a waiter woken by a predecessor that
// never held waited out that predecessor's 15 s instead of the holder's
// 1 s: TestWokenWaiterHolderDelay).
func (a *acquisition) delayLeft() time.Duration {
	d := time.Until(a.notBefore)
	if d > 0 && !a.guess {
		return min(d, MaxLockDelay)
	}
	p := max(a.pause, delayRetry)
	a.pause = min(2*p, delayRetryMax)
	if d > 0 {
		p = min(p, d)
	}
	return p
}

// take tries to acquire the lock key in one transaction guarded by the key
// being as seen (absent, or at its ModifyIndex); it locks the key with our
// session and reads our entry's subtree (whom to hand the lock to). First
// (not queued), the same transaction creates our entry and sets the tail
// key to it, guarded by the tail key being as seen (absent, or at its
// ModifyIndex). The token is the ModifyIndex of that write.
func (a *acquisition) take(ctx context.Context, seen, tail *api.KVPair, first bool) (uint64, outcome, error) {
	m := a.m
	plain := false // the tail key written plain (see tailOps)
again:
	ops := a.how.write(m, seen)
	tailAt := -1 // the index of the tail key's write
	if first {
		guard := kvOp(api.KVCheckNotExists, m.tailKey)
		if tail != nil {
			guard = checkIndex(m.tailKey, tail.ModifyIndex)
		}
		ops = append(ops, guard,
			kvOp(api.KVDeleteTree, m.queueKey),
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.queueKey, Session: m.s.id, Value: m.entryValue()}})
		tailAt = len(ops) + 1
		ops = append(ops, m.tailOps(m.s.id, []byte(m.s.id), plain)...)
	}
	ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.queueKey + heldSuffix, Session: m.s.id}}, kvOp(api.KVGetTree, m.queueKey))
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	a.left = true // until we know the outcome
	resp, err := a.send(rctx, ops)
	var rb *rollback
	switch {
	case err == nil:
	case errors.As(err, &rb) && !plain && rb.delayedOnly(tailAt):
		plain = true
		cancel()
		goto again
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
	v := m.parse(resp.Results)
	if v.lock == nil || v.lock.Session != m.s.id || v.me == nil {
		return 0, 0, errors.New("holdfast/consul: acquire: Consul's answer has no lock entry of ours")
	}
	if first {
		a.queueIndex, a.tailIndex = v.me.CreateIndex, v.me.CreateIndex
		if plain {
			m.relockTail(m.s.id, a.queueIndex, a.tailIndex)
		}
	} else if a.plainTail {
		// The lock-delay that refused our tail key's acquire is likely
		// over too: try it at once (see relockTail).
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		if at, _ := m.relockTailOnce(rctx, m.s.id, a.queueIndex, a.tailIndex); at != 0 {
			a.tailIndex, a.plainTail = at, false // our release checks the tail key at its index
		}
		cancel()
	}
	a.next = v.next
	a.mine = max(a.mine, v.lock.ModifyIndex)
	return v.lock.ModifyIndex, taken, nil
}

// enqueue creates our entry (step 2) and returns the lock key read in the
// same transaction, which also reads the tail key and sets it to us: the
// entry it named is our predecessor. A leftover entry of ours is replaced,
// with its subtree, so that our place is always at the back.
func (a *acquisition) enqueue(ctx context.Context) (*api.KVPair, error) {
	m := a.m
	plain := false // the tail key written plain (see tailOps)
again:
	ops := append(append(api.TxnOps{kvOp(api.KVGetOrEmpty, m.tailKey)}, m.tailOps(m.s.id, []byte(m.s.id), plain)...),
		kvOp(api.KVGetTree, m.queueKey+"/"),
		kvOp(api.KVDeleteTree, m.queueKey),
		&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.queueKey, Session: m.s.id, Value: m.entryValue()}},
		kvOp(api.KVGetOrEmpty, m.lockKey),
	)
	a.left = true
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := a.send(rctx, ops)
	var rb *rollback
	switch {
	case err == nil:
	case errors.As(err, &rb) && !plain && rb.delayedOnly(2):
		plain = true
		cancel()
		goto again
	case errors.As(err, &rb) && rb.denied():
		return nil, txnError("queue up on "+m.name, rb)
	case rb != nil && (rb.sessionGone() || rb.lockDelayed()):
		// Our own entry can only be in a lock-delay if our session was
		// invalidated.
		return nil, m.s.ended()
	case rb != nil:
		return nil, txnError("queue up on "+m.name, rb)
	default:
		return nil, err
	}
	var tail, me, lock *api.KVPair
	var wake api.TxnOps // what wakes those linked behind a leftover entry of ours
	for _, r := range resp.Results {
		switch e := r.KV; {
		case e == nil:
		case e.Key == m.tailKey && tail == nil:
			tail = e // the first answer about it: its value before ours
		case e.Key == m.queueKey && e.Session == m.s.id:
			me = e
		case e.Key == m.lockKey && e.ModifyIndex != 0:
			lock = e
		case strings.HasPrefix(e.Key, m.queueKey+"/"):
			if op := wakeOp(e); op != nil {
				wake = append(wake, op)
			}
		}
	}
	if me == nil {
		return nil, errors.New("holdfast/consul: queue up: Consul's answer has no queue entry of ours")
	}
	a.queueIndex, a.tailIndex, a.mine = me.CreateIndex, me.CreateIndex, me.CreateIndex
	if a.plainTail = plain; plain {
		m.relockTail(m.s.id, a.queueIndex, a.tailIndex)
	}
	if a.since == 0 {
		a.since = me.CreateIndex
	}
	a.pred, a.linked, a.lost, a.next = nil, false, false, nil
	if p, ok := m.tailEntry(tail); ok {
		a.pred = &p
		// Our own earlier entry (it was replaced): we do not know who
		// queued before it.
		a.lost = p.session == m.s.id
	} else if tail != nil && tail.ModifyIndex != 0 {
		a.lost = true // a tail we cannot read
	}
	if lock != nil && lock.Session == m.s.id && !a.handedToUs(lock) {
		// A handoff to a leftover entry of ours (a request of a failed
		// acquisition that landed after its cleanup): no grant of ours
		// holds it (we hold the name in-process), so release it, and
		// read the queue again.
		if err := m.s.releaseKey(ctx, m.lockKey); err != nil && !errors.Is(err, holdfast.ErrNotHeld) {
			return nil, err
		}
		lock, a.lost = nil, true
	}
	if len(wake) > 0 {
		if _, err := m.s.txn(ctx, wake[:min(len(wake), MaxTxnOps)]); err != nil {
			return nil, err
		}
	}
	return lock, nil
}

// list returns the names right under "<name>/" (the keys with separator
// "/": "<name>/.queue/" stands for the whole queue). If one is not the
// lock's own, it reads the subtree, and fails with ErrConflict if a live
// lock lies under the name (see Mutex.compatible).
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
			// Another key: a conflict only if it is a live lock (see
			// Mutex.compatible), which a read of the subtree tells.
			v, err := a.read(ctx)
			if err != nil {
				return nil, err
			}
			if err := m.deadLock(ctx, v.lock); err != nil {
				return nil, err
			}
			return names, m.compatible(v)
		}
	}
	return names, nil
}

// read returns the subtree of the lock, in one read-only transaction.
func (a *acquisition) read(ctx context.Context, ops ...*api.TxnOp) (view, error) {
	return a.m.read(ctx, ops...)
}

// read returns the subtree of the lock, in one transaction, after ops.
func (m *Mutex) read(ctx context.Context, ops ...*api.TxnOp) (view, error) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := m.s.txn(rctx, append(ops, kvOp(api.KVGetTree, m.prefix)))
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

// watchKey blocks until key's ModifyIndex is no longer index (it changed or
// is gone), and returns the key as it then is (nil if gone). Each blocking
// query waits at most blockWait and has a client-side timeout; timeouts and
// transport errors are retried (core.Backoff) until ctx ends (with the
// session, if the store stays unreachable). With bound > 0 it returns nil,
// nil once bound has passed without a change.
func (s *Session) watchKey(ctx context.Context, key string, index uint64, bound time.Duration) (*api.KVPair, error) {
	wait := index
	start := time.Now()
	for {
		w := blockWait
		if bound > 0 {
			if w = min(w, bound-time.Since(start)); w <= 0 {
				return nil, nil
			}
		}
		var pair *api.KVPair
		var meta *api.QueryMeta
		err := core.Backoff{Attempt: blockTimeout(w), Final: queryRefused}.Retry(ctx, func(ctx context.Context) (err error) {
			q := &api.QueryOptions{WaitIndex: wait, WaitTime: w}
			pair, meta, err = s.client.KV().Get(key, q.WithContext(ctx))
			return err
		})
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, apiError("watch "+key, err)
		case pair == nil || pair.ModifyIndex != index:
			return pair, nil
		}
		wait = max(meta.LastIndex, index)
	}
}

// watchTree blocks until the index of the subtree under prefix is no longer
// index (something under it changed), and returns its keys and new index.
// Timeouts and transport errors are retried as in watchKey. With bound > 0
// it returns nil, index, nil once bound has passed without a change.
func (s *Session) watchTree(ctx context.Context, prefix string, index uint64, bound time.Duration) (api.KVPairs, uint64, error) {
	start := time.Now()
	for {
		w := blockWait
		if bound > 0 {
			if w = min(w, bound-time.Since(start)); w <= 0 {
				return nil, index, nil
			}
		}
		var pairs api.KVPairs
		var meta *api.QueryMeta
		err := core.Backoff{Attempt: blockTimeout(w), Final: queryRefused}.Retry(ctx, func(ctx context.Context) (err error) {
			q := &api.QueryOptions{WaitIndex: index, WaitTime: w}
			pairs, meta, err = s.client.KV().List(prefix, q.WithContext(ctx))
			return err
		})
		switch {
		case ctx.Err() != nil:
			return nil, 0, ctx.Err()
		case err != nil:
			return nil, 0, apiError("watch "+prefix, err)
		case meta.LastIndex != index:
			return pairs, meta.LastIndex, nil
		}
	}
}

// queryRefused reports whether a blocking query was refused (HTTP 4xx: an
// ACL, a bad request): retrying cannot change that.
func queryRefused(err error) bool { code := statusCode(err); return code >= 400 && code < 500 }

// dropDead deletes keys whose session is gone (queue entries with their
// subtrees, contender keys, left by sessions with Behavior release), at most
// maxDropDead at a time. Such keys are ignored anyway, but nobody may read
// the queue again to find them: a request that fails without an answer
// (refused, lost, or ctx ended) is retried in the session's background
// while it lives; a failed check-and-set means they changed (dropped
// already).
func (s *Session) dropDead(ctx context.Context, dead []*api.KVPair) {
	if len(dead) == 0 {
		return
	}
	dead = dead[:min(len(dead), maxDropDead)]
	ops := make(api.TxnOps, 0, 2*len(dead))
	for _, e := range dead {
		ops = append(ops, deleteCAS(e.Key, e.ModifyIndex))
		if i := strings.Index(e.Key, queueInfix); i >= 0 && !strings.Contains(e.Key[i+len(queueInfix):], "/") {
			ops = append(ops, kvOp(api.KVDeleteTree, e.Key+"/")) // a queue entry's links and marks
		} else if op := wakeOp(e); op != nil {
			ops = append(ops, op) // a link or anchor under a gone entry: wake its waiter
		}
	}
	drop := func(ctx context.Context) error {
		_, err := s.txn(ctx, ops)
		var rb *rollback
		if errors.As(err, &rb) {
			return nil
		}
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	err := drop(rctx)
	cancel()
	if err != nil {
		s.bg.Go(func(ctx context.Context) { _ = core.Retry(ctx, drop) })
	}
}

// view is what we know of a lock: the keys under "<name>/".
type view struct {
	lock  *api.KVPair   // nil if absent
	queue []*api.KVPair // live queue entries, by CreateIndex
	dead  []*api.KVPair // queue entries whose session is gone
	me    *api.KVPair   // our live queue entry, if any
	tail  *api.KVPair   // the tail key, if present
	other string        // a key of a longer name, if any
	// Under our entry: the live link behind it (the latest), our anchor
	// (the latest), the held mark.
	next   *waiter
	anchor *api.KVPair
	held   *api.KVPair
	// holders are the sessions whose entry has a held mark: the holder,
	// or one that lost its grant and has not left yet.
	holders map[string]bool
}

// waiting returns the number of live entries that wait (no held mark).
func (v view) waiting() int {
	n := 0
	for _, e := range v.queue {
		if !v.holders[e.Session] {
			n++
		}
	}
	return n
}

// parse builds a view from the results of a transaction that read the
// subtree "<name>/" or part of it (other results about those keys are
// merged in; the last answer about the lock key is the latest).
func (m *Mutex) parse(results []*api.TxnResult) view {
	var v view
	seen := make(map[string]bool, len(results))
	mine := m.queueKey + "/"
	var children []*api.KVPair // other entries' links and marks
	for _, r := range results {
		e := r.KV
		if e == nil || e.ModifyIndex == 0 {
			continue
		}
		if e.Key == m.lockKey {
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
		sub, isMine := strings.CutPrefix(e.Key, mine)
		switch {
		case isMine:
			v.child(m, sub, e)
		case isQueue && id != "" && !strings.Contains(id, "/"):
			if e.Session == "" {
				v.dead = append(v.dead, e)
				continue
			}
			v.queue = append(v.queue, e)
			if e.Key == m.queueKey && e.Session == m.s.id {
				v.me = e
			}
		case isQueue && id != "": // another entry's links and marks
			session, _, _ := strings.Cut(id, "/")
			if strings.TrimPrefix(id, session) == heldSuffix && e.Session != "" {
				if v.holders == nil {
					v.holders = make(map[string]bool)
				}
				v.holders[session] = true
			}
			children = append(children, e)
		case strings.HasPrefix(e.Key, m.prefix) && e.Session != "":
			v.other = e.Key // a live lock of a longer name, or a foreign one
		}
	}
	slices.SortFunc(v.queue, func(x, y *api.KVPair) int { return cmp.Compare(x.CreateIndex, y.CreateIndex) })
	for _, e := range children {
		// Under an entry that is gone (deleted with its session, Behavior
		// delete): dead too.
		if entry, _, _ := strings.Cut(strings.TrimPrefix(e.Key, m.queuePrefix), "/"); !seen[m.queuePrefix+entry] {
			v.dead = append(v.dead, e)
		}
	}
	return v
}

// child notes e, the key sub under our entry.
func (v *view) child(m *Mutex, sub string, e *api.KVPair) {
	switch {
	case sub == heldSuffix[1:]:
		v.held = e
	case strings.HasPrefix(sub, nextInfix[1:]):
		w := strings.TrimPrefix(sub, nextInfix[1:])
		index, err := strconv.ParseUint(string(e.Value), 10, 64)
		if err == nil && w != "" && e.Session == w && (v.next == nil || index > v.next.index) {
			n := m.entry(w, index)
			v.next = &n
		}
	case strings.HasPrefix(sub, prevInfix[1:]):
		if v.anchor == nil || e.CreateIndex > v.anchor.CreateIndex {
			v.anchor = e
		}
	}
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

// compatible returns an error wrapping holdfast.ErrConflict if a live lock
// lies under "<name>/": a key held by a session (a lock of a longer name,
// an api.Semaphore's contender). A key held by no session (a plain data
// key, a dead contender's) is nobody's lock: it is left alone. (A lock key
// of another kind is checked before it is taken: see Mutex.deadLock.)
func (m *Mutex) compatible(v view) error {
	if v.other != "" {
		return fmt.Errorf("%w: %q is under %s/: a lock on %s would cover a lock of a longer name", holdfast.ErrConflict, v.other, m.name, m.name)
	}
	return nil
}

// compatibleLock returns an error wrapping holdfast.ErrConflict if the lock
// key exists with flags other than a lock's (a semaphore's, say).
func (m *Mutex) compatibleLock(lock *api.KVPair) error {
	if otherKind(lock) {
		return fmt.Errorf("%w: %s has flags %#x, not a lock's %#x", holdfast.ErrConflict, m.lockKey, lock.Flags, uint64(api.LockFlagValue))
	}
	return nil
}

// otherKind reports whether lock is the lock key of another kind of lock
// (flags other than a lock's: a semaphore's, an RWMutex's).
func otherKind(lock *api.KVPair) bool { return lock != nil && lock.Flags != api.LockFlagValue }

// deadLock returns nil if lock, the lock key as read, is a lock's, or is
// another kind's that is dead (see deadKey.go): the take then replaces it,
// guarded by its index. A live one is an error wrapping
// holdfast.ErrConflict that says how to free the name (before, a Mutex
// refused the name for ever once a `consul lock -n` was killed:
// TestDeadSemaphoreLockKey; or once an RWMutex's holder was cut off:
// TestDeadRWLockKey).
func (m *Mutex) deadLock(ctx context.Context, lock *api.KVPair) error {
	if !otherKind(lock) {
		return nil
	}
	own := func(key string) bool { return key == m.tailKey || strings.HasPrefix(key, m.queuePrefix) }
	return m.s.deadKey(ctx, m.prefix, lock, own, "a holdfast Mutex or Election")
}

// lockHold is the release state of a grant taken through the queue (a
// Mutex's, or an Election's with resign). Used only by the release, which
// runs once, in one goroutine: the waiter linked behind us (nil: none
// known), our token, our entry's CreateIndex, the tail key's ModifyIndex
// when it named our entry last as far as we know (0: absent), and the index
// of our entry's subtree as last seen.
type lockHold struct {
	m          *Mutex
	resign     bool
	next       *waiter
	token      uint64
	queueIndex uint64
	tailIndex  uint64
	mine       uint64
}

// errStale means that the waiter we meant to hand the lock to, or the tail
// key, changed since we learnt them: look again.
var errStale = errors.New("the next waiter or the tail key changed")

// release ends a grant taken through the queue; the session runs it in the
// background (see core.Grant), retried on transport errors while the
// session lives. After Unlock it hands the lock to the waiter linked behind
// us (see pass), or deletes it with our entry if nobody queued behind us;
// when neither is known to hold, it learns who did (see look). After a loss
// it leaves the queue (see Mutex.leave) and deletes the lock key if our
// session still holds it.
func (g *lockHold) release(ctx context.Context, gr *Grant) error {
	if !errors.Is(context.Cause(gr.Context()), holdfast.ErrReleased) {
		return g.drop(ctx, gr) // a lost grant
	}
	var err error
	for i := 0; i < 4; i++ {
		if g.next != nil {
			err = g.pass(ctx)
		} else {
			err = g.alone(ctx)
		}
		if !errors.Is(err, errStale) {
			break
		}
		if err = g.look(ctx, i == 0); err != nil {
			break
		}
		err = errStale
	}
	if errors.Is(err, holdfast.ErrNotHeld) {
		// The key was deleted or taken over from outside: leave the queue.
		g.m.s.checkSoon()
		if _, lerr := g.m.leave(ctx); lerr != nil {
			return lerr
		}
	}
	return err // errStale four times over: retried
}

// drop releases the lock key without handing it over, and leaves the queue
// (after a loss, or as the session closes). A lock key that our ended
// session left free (Behavior release) is deleted as a failed acquisition's
// cleanup does (see Session.clean): nobody else would.
func (g *lockHold) drop(ctx context.Context, _ *Grant) error {
	err := g.m.s.releaseKey(ctx, g.m.lockKey)
	e, lerr := g.m.leave(ctx)
	if lerr != nil && (err == nil || errors.Is(err, holdfast.ErrNotHeld)) {
		return lerr
	}
	if lerr == nil && e != nil && e.Session == "" && e.Flags == api.LockFlagValue {
		_, _ = g.m.s.txn(ctx, api.TxnOps{deleteCAS(g.m.lockKey, e.ModifyIndex)})
	}
	return err
}

// pass, the write behind Unlock, hands the lock to the waiter w linked
// behind us, in one transaction: [check-session of the lock key on our
// session, delete it and lock it for w's session, check-index of w's
// entry, write w's held mark, delete w's anchor on us, read our links,
// delete our entry and its subtree]. w's blocking query on its subtree
// answers with the mark: it holds, with the ModifyIndex of this write as
// its token, and knows whom it hands to next (its own link). With resign
// (an Election's grant) the key is deleted instead, and w, woken by its
// anchor's deletion, takes it itself.
//
// A failed check-session is an error wrapping holdfast.ErrNotHeld; a
// failed check of w is errStale.
func (g *lockHold) pass(ctx context.Context) error {
	s, m, key, w := g.m.s, g.m, g.m.lockKey, *g.next
	ops := releaseGuard(key, s.id)
	held := len(ops) // ops before this index check that we hold the key
	if g.resign {
		ops = append(ops, kvOp(api.KVDelete, key))
	} else {
		// A delete and an acquire for w: the key is never seen free, and a
		// delete answers nothing where an unlock answers the entry (bytes
		// on every handoff).
		ops = append(ops, kvOp(api.KVDelete, key), lockOp(key, w.session, []byte(valueTaken)))
		ops = append(ops, nextGuard(w)...)
		ops = append(ops,
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: w.key + heldSuffix, Session: w.session}})
	}
	ops = append(ops, kvOp(api.KVDelete, w.key+prevInfix+s.id), kvOp(api.KVGetTree, m.queueKey+nextInfix), kvOp(api.KVDeleteTree, m.queueKey))
	return g.send(ctx, ops, held)
}

// alone releases the lock when nobody queued behind us: [check-session,
// check-index of the tail key at the index it had when it named our entry
// and its delete (or check that it is absent), delete the lock key, delete
// our entry and its subtree]. A waiter that queued behind us moved the tail
// key, or it went with that waiter's session: errStale.
func (g *lockHold) alone(ctx context.Context) error {
	m := g.m
	ops := releaseGuard(m.lockKey, m.s.id)
	held := len(ops)
	if g.tailIndex == 0 {
		ops = append(ops, kvOp(api.KVCheckNotExists, m.tailKey))
	} else {
		// A check-index, not a delete-cas (which succeeds on an absent
		// key): a tail key deleted with the session of a waiter that
		// queued behind us (Behavior delete) leaves that waiter's anchor
		// on us, which look's read then deletes (before, it stayed while
		// our session lived: TestExpiredSessionLeavesNothing).
		ops = append(ops, checkIndex(m.tailKey, g.tailIndex), kvOp(api.KVDelete, m.tailKey))
	}
	ops = append(ops, kvOp(api.KVDelete, m.lockKey), kvOp(api.KVGetTree, m.queueKey+nextInfix), kvOp(api.KVDeleteTree, m.queueKey))
	return g.send(ctx, ops, held)
}

// send runs a release's transaction; ops before held check that we hold
// the lock key. The transaction reads the links under our entry before it
// deletes them: the anchors on us of the waiters linked there other than
// the one the lock goes to (a waiter that relinked to us after a read, say)
// are deleted next, which wakes them, as a leave does (before, they waited
// on an anchor nobody would delete until our session ended).
func (g *lockHold) send(ctx context.Context, ops api.TxnOps, held int) error {
	resp, err := g.m.s.txn(ctx, ops)
	var rb *rollback
	switch {
	case err == nil:
		var wake api.TxnOps
		for _, r := range resp.Results {
			if e := r.KV; e != nil && strings.HasPrefix(e.Key, g.m.queueKey+nextInfix) && (g.next == nil || !strings.HasSuffix(e.Key, nextInfix+g.next.session)) {
				if op := wakeOp(e); op != nil {
					wake = append(wake, op)
				}
			}
		}
		if len(wake) > 0 {
			_ = core.Retry(ctx, func(actx context.Context) error {
				_, err := g.m.s.txn(actx, wake[:min(len(wake), MaxTxnOps)])
				return err
			})
		}
		return nil
	case errors.As(err, &rb) && rb.denied():
		return txnError("unlock "+g.m.lockKey, rb)
	case rb != nil && rb.failedBefore(held):
		return fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, g.m.lockKey, g.m.s.id)
	case rb != nil:
		g.next = nil
		return errStale
	default:
		return err
	}
}

// look learns whom to hand the lock to. First (wait), it blocks on our
// entry's subtree up to linkWait for the link of the waiter that queued
// behind us (it links itself as soon as it has queued). Otherwise it reads
// the whole queue: the first live entry other than ours is the next
// waiter, and if there is none, the tail key's index is noted (nobody
// queues behind us). Dead entries it finds are deleted (at most 64 at a
// time). It returns an error wrapping holdfast.ErrNotHeld if our session
// no longer holds the key.
func (g *lockHold) look(ctx context.Context, wait bool) error {
	m := g.m
	if wait {
		for start := time.Now(); time.Since(start) < linkWait; {
			pairs, index, err := m.s.watchTree(ctx, m.queueKey, g.mine, linkWait-time.Since(start))
			if err != nil {
				return err
			}
			if pairs == nil && index == g.mine {
				break // no link came
			}
			g.mine = index
			results := make([]*api.TxnResult, 0, len(pairs))
			for _, p := range pairs {
				results = append(results, &api.TxnResult{KV: p})
			}
			if v := m.parse(results); v.next != nil {
				g.next = v.next
				return nil
			}
		}
	}
	v, err := m.read(ctx)
	if err != nil {
		return err
	}
	if v.lock == nil || v.lock.Session != m.s.id {
		return fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, m.lockKey, m.s.id)
	}
	m.s.dropDead(ctx, v.dead)
	g.next, g.tailIndex = nil, 0
	for _, e := range v.queue {
		if e.Key != m.queueKey {
			w := m.entry(e.Session, e.CreateIndex)
			g.next = &w
			return nil
		}
	}
	if v.tail != nil {
		g.tailIndex = v.tail.ModifyIndex
	}
	return nil
}

// leave takes our entry out of the queue, in two steps that a retry can
// repeat whatever became of the last attempt. First, one transaction reads
// our entry's subtree, the lock key and the tail key, and deletes our entry
// and its held mark: nobody links behind it any more (a link is guarded by
// the entry's index), and the links and anchors under it stay, so the next
// attempt still knows whom to wake. Then, if there are any, one transaction
// deletes the anchors on us of the waiters linked behind us (which wakes
// them: they link themselves again, to the entry ahead of ours) and our
// link under our predecessor, with the rest of our subtree. (A reader that
// meets those children under a gone entry deletes them as dead, and wakes
// the same waiters: see Session.dropDead.) If the tail key names our
// session, it is repaired (see Mutex.repairTail). It returns the lock key as
// read.
func (m *Mutex) leave(ctx context.Context) (*api.KVPair, error) {
	s := m.s
	resp, err := s.txn(ctx, api.TxnOps{
		kvOp(api.KVGetTree, m.queueKey), kvOp(api.KVGetOrEmpty, m.lockKey), kvOp(api.KVGetOrEmpty, m.tailKey),
		kvOp(api.KVDelete, m.queueKey), kvOp(api.KVDelete, m.queueKey+heldSuffix),
	})
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return nil, txnError("leave the queue of "+m.name, rb)
	case err != nil:
		return nil, err
	}
	var lock, tail *api.KVPair
	var wake api.TxnOps
	for _, r := range resp.Results {
		switch e := r.KV; {
		case e == nil || e.ModifyIndex == 0:
		case e.Key == m.lockKey:
			lock = e
		case e.Key == m.tailKey:
			tail = e
		case strings.HasPrefix(e.Key, m.queueKey+"/"):
			if op := wakeOp(e); op != nil {
				wake = append(wake, op)
			}
		}
	}
	if len(wake) > 0 {
		wake = append(wake[:min(len(wake), MaxTxnOps-1)], kvOp(api.KVDeleteTree, m.queueKey+"/"))
		if _, err := s.txn(ctx, wake); err != nil {
			return nil, err
		}
	}
	if t, ok := m.tailEntry(tail); ok && t.session == s.id {
		if err := m.repairTail(ctx); err != nil {
			return nil, err
		}
	}
	return lock, nil
}

// wakeOp returns what wakes the waiter that e, a key under a queue entry E
// that is gone, stands for (nil if none): for the link "E/next/W" of a live
// waiter W, the deletion of W's anchor "W/prev/E"; for E's anchor
// "E/prev/P", the deletion of E's link under P ("P/next/E").
func wakeOp(e *api.KVPair) *api.TxnOp {
	i := strings.LastIndex(e.Key, queueInfix)
	if i < 0 {
		return nil
	}
	prefix := e.Key[:i+len(queueInfix)]
	entry, sub, _ := strings.Cut(e.Key[i+len(queueInfix):], "/")
	if w, ok := strings.CutPrefix(sub, nextInfix[1:]); ok && w != "" && e.Session != "" {
		return kvOp(api.KVDelete, prefix+w+prevInfix+entry)
	}
	if p, ok := strings.CutPrefix(sub, prevInfix[1:]); ok && p != "" {
		return kvOp(api.KVDelete, prefix+p+nextInfix+entry)
	}
	return nil
}
