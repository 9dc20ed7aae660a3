package consul

import (
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
)

// acquisition is one Lock or TryLock call in progress.
type acquisition struct {
	m *Mutex
	// campaign says that this is an Election's Campaign with the proposal
	// value (campaign.go), not a Mutex's Lock: see takeOps, handed and
	// hold, the only places where they differ.
	campaign bool
	value    []byte

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

// takeOps returns the operations that take the lock key as seen (nil if
// absent): a guard that it is still so, and the acquire with our value. A
// campaign deletes a free key as seen and creates it anew (campaign.go).
func (a *acquisition) takeOps(seen *api.KVPair) api.TxnOps {
	m, value := a.m, []byte(valueTaken)
	guard := kvOp(api.KVCheckNotExists, m.lockKey())
	switch {
	case a.campaign && seen != nil:
		guard = deleteCAS(m.lockKey(), seen.ModifyIndex)
	case seen != nil:
		guard = checkIndex(m.lockKey(), seen.ModifyIndex)
	}
	if a.campaign {
		value = a.value
	}
	return api.TxnOps{guard, lockOp(m.lockKey(), m.s.id, value)}
}

// handed accepts the lock key handed to us with token by the holder before
// us (step 5) and returns the grant's token: a campaign retakes it.
func (a *acquisition) handed(ctx context.Context, token uint64) (uint64, error) {
	if a.campaign {
		return a.retake(ctx)
	}
	return token, nil
}

// hold returns the grant's releaser: what its Unlock does (a campaign's
// resigns: it deletes the key, handing nothing over).
func (a *acquisition) hold() releaser {
	return &lockHold{m: a.m, resign: a.campaign, next: a.next, tailIndex: a.tailIndex, mine: a.mine}
}

// outcome is what an attempt to acquire the lock key came to.
type outcome int

const (
	taken   outcome = iota // we hold the lock key
	busy                   // another session holds it, or it changed since we read it
	delayed                // a lock-delay is in effect on it
)

// join is the waiting algorithm of the Mutex and the Election (TryLock's
// if try): it returns the token. Its steps
// are in docs/DESIGN.md ("Consul acquire"), numbered as below. ctx ends
// with the session; what a failed join left is removed by the driver (see
// left).
func (a *acquisition) join(ctx context.Context, try bool) (uint64, error) {
	if try {
		return a.try(ctx)
	}
	// 1. A name with nothing under it: take the lock, with our entry and
	// the tail key naming it.
	names, err := a.list(ctx)
	if err != nil {
		return 0, err
	}
	if len(names) == 0 { // else the lock key, the tail key, queue entries
		token, out, err := a.take(ctx, nil, nil, true)
		if err != nil || out == taken {
			return token, err
		}
		// Another contender was faster, or a lock-delay is in effect.
	}
	lock, err := a.enqueue(ctx) // 2. queue up
	if err != nil {
		return 0, err
	}
	return a.wait(ctx, lock)
}

// try is TryLock's step 1: from a read of the subtree, it takes the lock
// only if it is free and no live entry queues; otherwise the error wraps
// holdfast.ErrLocked.
func (a *acquisition) try(ctx context.Context) (uint64, error) {
	m := a.m
	v, err := m.readChecked(ctx)
	if err != nil {
		return 0, err
	}
	m.s.dropDead(ctx, v.dead) // else nobody may read them again: left for good
	out := busy
	if free(v.lock) && v.waiting() == 0 {
		var token uint64
		if token, out, err = a.take(ctx, v.lock, v.tail, true); err != nil || out == taken {
			return token, err
		}
	}
	if out == delayed {
		return 0, fmt.Errorf("%w: %s is in its lock-delay after its holder's session ended", holdfast.ErrLocked, m.name)
	}
	return 0, fmt.Errorf("%w: %s is held or waited for", holdfast.ErrLocked, m.name)
}

// wait runs steps 3 to 6 from lock, the lock key as last read. Each step
// returns a token, 0 until the lock is ours.
func (a *acquisition) wait(ctx context.Context, lock *api.KVPair) (uint64, error) {
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		var token uint64
		var err error
		switch {
		case a.handedToUs(lock): // 6. handed to us by a holder that read the queue
			return a.handed(ctx, tokenOf(lock))
		case a.lost: // 3. with a read: who is ahead of us now
			lock, err = a.reread(ctx)
		case a.pred != nil && !a.linked: // 3. link
			err = a.link(ctx)
		case a.pred != nil: // 4. block on our entry's subtree, 5. held
			token, err = a.block(ctx)
		default: // 6. at the head
			token, lock, err = a.atHead(ctx, lock)
		}
		if token != 0 || err != nil {
			return token, err
		}
	}
}

// reread reads the queue when we do not know who is ahead of us (step 3
// with a read), dropping our link under the predecessor we knew, and
// returns the lock key as read. Our entry gone: queue up again (step 2).
func (a *acquisition) reread(ctx context.Context) (*api.KVPair, error) {
	m := a.m
	var drop api.TxnOps // our link under the predecessor we leave
	if a.pred != nil && a.linked {
		drop = api.TxnOps{kvOp(api.KVDelete, a.pred.key+nextInfix+m.s.id)}
	}
	v, err := m.read(ctx, drop...)
	if err != nil {
		return nil, err
	}
	if err := m.compatible(v); err != nil {
		return nil, err
	}
	m.s.dropDead(ctx, v.dead)
	a.lost, a.pred, a.linked = false, nil, false
	switch {
	case a.handedToUs(v.lock):
	case v.me == nil || v.me.CreateIndex != a.queueIndex:
		// Our entry vanished or lost its session. Queue up again; if our
		// session is gone, Consul says so.
		return a.enqueue(ctx)
	default:
		a.next = v.next
		if p := v.predecessor(); p != nil {
			w := m.entry(p.Session, p.CreateIndex)
			a.pred = &w
		}
	}
	return v.lock, nil
}

// block waits for our entry's subtree to change (step 4) and returns the
// token if it holds our held mark (step 5). A link behind us is noted;
// our entry or our anchor gone sets lost (step 3 with a read next).
func (a *acquisition) block(ctx context.Context) (uint64, error) {
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
		return a.handed(ctx, v.held.ModifyIndex)
	case v.anchor == nil || v.anchor.Session != a.pred.session:
		// Our predecessor left, or its session ended (then it may have
		// held the lock: its lock-delay applies from now).
		a.delayFrom(v.anchor != nil && a.holder == a.pred.session)
		a.lost = true
	}
	return 0, nil
}

// atHead is step 6, at the head of the queue (nobody can queue ahead of
// us any more): it waits for the lock key, lock as last read, to be free,
// then takes it; it returns the token, or the lock key to look at next.
func (a *acquisition) atHead(ctx context.Context, lock *api.KVPair) (uint64, *api.KVPair, error) {
	m := a.m
	if !free(lock) {
		lock, err := a.waitRelease(ctx, lock)
		return 0, lock, err
	}
	if err := m.deadLock(ctx, lock); err != nil {
		return 0, nil, err
	}
	token, out, err := a.take(ctx, lock, nil, false)
	switch {
	case err != nil || out == taken:
		return token, nil, err
	case out == delayed:
		if a.notBefore.IsZero() && a.known {
			// Our predecessor's anchor was deleted, not freed (Behavior
			// delete): it died, or it left and another holder did. If it
			// held the lock last, its delay started at most now.
			a.notBefore, a.guess = time.Now().Add(a.delay), true
		}
		if !sleep(ctx, a.delayLeft()) {
			return 0, nil, ctx.Err()
		}
		return 0, lock, nil
	}
	// busy: a foreign client took it, or it changed
	lock, err = a.get(ctx, m.lockKey())
	return 0, lock, err
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
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.queueKey() + prevInfix + p.session, Session: p.session}},
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

// watchMine blocks until our entry's subtree changes (it was last seen at
// a.mine), and returns it (see Session.watchTree).
func (a *acquisition) watchMine(ctx context.Context) (view, error) {
	pairs, index, err := a.m.s.watchTree(ctx, a.m.queueKey(), a.mine, 0)
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
	next, err := a.m.s.watchKey(ctx, a.m.lockKey(), lock.ModifyIndex, 0)
	if err != nil {
		return nil, err
	}
	if free(next) {
		a.delayFrom(true)
	}
	return next, nil
}

// delayFrom forgets the end of a lock-delay we waited for; if started, the
// delay of the holder we saw (if known) starts now.
func (a *acquisition) delayFrom(started bool) {
	a.notBefore, a.guess, a.pause = time.Time{}, false, 0
	if started && a.known {
		a.notBefore = time.Now().Add(a.delay)
	}
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
	a.left = true // until we know the outcome
	resp, plain, err := m.sendTail(ctx, a.send, func(plain bool) api.TxnOps {
		ops := a.takeOps(seen)
		if first {
			guard := kvOp(api.KVCheckNotExists, m.tailKey())
			if tail != nil {
				guard = checkIndex(m.tailKey(), tail.ModifyIndex)
			}
			ops = append(append(ops, guard), m.queueOps(plain)...)
		}
		return append(ops, acquireOp(m.queueKey()+heldSuffix, m.s.id, nil), kvOp(api.KVGetTree, m.queueKey()))
	})
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.denied():
		return 0, 0, txnError("acquire "+m.lockKey(), rb)
	case rb != nil && rb.lockDelayed():
		a.left = a.queueIndex != 0
		return 0, delayed, nil
	case rb != nil && rb.sessionGone():
		return 0, 0, m.s.ended()
	case rb != nil:
		a.left = a.queueIndex != 0
		return 0, busy, nil
	case err != nil:
		return 0, 0, err
	}
	v := m.parse(resp.Results)
	if v.lock == nil || v.lock.Session != m.s.id || v.me == nil {
		return 0, 0, errors.New("holdfast/consul: acquire: Consul's answer has no lock entry of ours")
	}
	if first {
		a.queued(v.me, plain)
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

// queueOps returns the operations that create our entry (replacing a
// leftover of ours, with its subtree) and point the tail key at it (see
// tailOps).
func (m *Mutex) queueOps(plain bool) api.TxnOps {
	return append(api.TxnOps{kvOp(api.KVDeleteTree, m.queueKey()), acquireOp(m.queueKey(), m.s.id, m.entryValue())},
		m.tailOps(m.s.id, []byte(m.s.id), plain)...)
}

// sendTail sends ops(false) with send (a.send, or the session's txn), a
// write that may point the tail key at an entry (see tailOps), bounded by
// requestTimeout. If a lock-delay refused only the tail key's acquire, it
// sends ops(true), with the tail key written plain, and reports so.
func (m *Mutex) sendTail(ctx context.Context, send func(context.Context, api.TxnOps) (*api.TxnResponse, error), ops func(plain bool) api.TxnOps) (resp *api.TxnResponse, plain bool, err error) {
	for {
		o := ops(plain)
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		resp, err = send(rctx, o)
		cancel()
		tailAt := slices.IndexFunc(o, func(op *api.TxnOp) bool { return op.KV.Verb == api.KVLock && op.KV.Key == m.tailKey() })
		var rb *rollback
		if plain || tailAt < 0 || !errors.As(err, &rb) || !rb.delayedOnly(tailAt) {
			return resp, plain, err
		}
		plain = true
	}
}

// queued notes our entry me, just created, as the tail key names it (plain:
// written with no session, see relockTail).
func (a *acquisition) queued(me *api.KVPair, plain bool) {
	a.queueIndex, a.tailIndex = me.CreateIndex, me.CreateIndex
	if a.since == 0 {
		a.since = me.CreateIndex
	}
	if a.plainTail = plain; plain {
		a.m.relockTail(a.m.s.id, a.queueIndex, a.tailIndex)
	}
}

// enqueue creates our entry (step 2) and returns the lock key read in the
// same transaction, which also reads the tail key and sets it to us: the
// entry it named is our predecessor. A leftover entry of ours is replaced,
// with its subtree, so that our place is always at the back.
func (a *acquisition) enqueue(ctx context.Context) (*api.KVPair, error) {
	m := a.m
	a.left = true
	resp, plain, err := m.sendTail(ctx, a.send, func(plain bool) api.TxnOps {
		ops := api.TxnOps{kvOp(api.KVGetOrEmpty, m.tailKey()), kvOp(api.KVGetTree, m.queueKey()+"/")}
		return append(append(ops, m.queueOps(plain)...), kvOp(api.KVGetOrEmpty, m.lockKey()))
	})
	var rb *rollback
	switch {
	case errors.As(err, &rb) && !rb.denied() && (rb.sessionGone() || rb.lockDelayed()):
		// Our own entry can only be in a lock-delay if our session was
		// invalidated.
		return nil, m.s.ended()
	case rb != nil:
		return nil, txnError("queue up on "+m.name, rb)
	case err != nil:
		return nil, err
	}
	var tail, me, lock *api.KVPair
	var wake api.TxnOps // what wakes those linked behind a leftover entry of ours
	for _, r := range resp.Results {
		switch e := r.KV; {
		case e == nil:
		case e.Key == m.tailKey() && tail == nil:
			tail = e // the first answer about it: its value before ours
		case e.Key == m.queueKey() && e.Session == m.s.id:
			me = e
		case e.Key == m.lockKey() && e.ModifyIndex != 0:
			lock = e
		case strings.HasPrefix(e.Key, m.queueKey()+"/"):
			wake = appendWake(wake, e)
		}
	}
	if me == nil {
		return nil, errors.New("holdfast/consul: queue up: Consul's answer has no queue entry of ours")
	}
	a.queued(me, plain)
	a.mine = me.CreateIndex
	a.behind(tail)
	if lock != nil && lock.Session == m.s.id && !a.handedToUs(lock) {
		// A handoff to a leftover entry of ours (a request of a failed
		// acquisition that landed after its cleanup): no grant of ours
		// holds it (we hold the name in-process), so release it, and
		// read the queue again.
		if err := m.s.releaseKey(ctx, m.lockKey()); err != nil && !errors.Is(err, holdfast.ErrNotHeld) {
			return nil, err
		}
		lock, a.lost = nil, true
	}
	return lock, m.s.wake(ctx, wake)
}

// behind notes our predecessor: the entry that the tail key named before
// we queued (none: we are the head).
func (a *acquisition) behind(tail *api.KVPair) {
	a.pred, a.linked, a.lost, a.next = nil, false, false, nil
	if p, ok := a.m.tailEntry(tail); ok {
		a.pred = &p
		// Our own earlier entry (it was replaced): we do not know who
		// queued before it.
		a.lost = p.session == a.m.s.id
	} else if tail != nil && tail.ModifyIndex != 0 {
		a.lost = true // a tail we cannot read
	}
}

// list returns the names right under "<name>/" (the keys with separator
// "/": "<name>/.queue/" stands for the whole queue). If one is not the
// lock's own, it reads the subtree, and fails with ErrConflict if a live
// lock lies under the name (see Mutex.compatible).
func (a *acquisition) list(ctx context.Context) ([]string, error) {
	m := a.m
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	names, _, err := m.s.client.KV().Keys(m.prefix(), "/", (&api.QueryOptions{}).WithContext(rctx))
	if err != nil {
		return nil, apiError("list "+m.prefix(), err)
	}
	for _, k := range names {
		if k != m.lockKey() && k != m.tailKey() && k != m.queuePrefix() {
			// Another key: a conflict only if it is a live lock (see
			// Mutex.compatible), which a read of the subtree tells.
			_, err := m.readChecked(ctx)
			return names, err
		}
	}
	return names, nil
}

// readChecked reads the subtree, and fails with holdfast.ErrConflict if a
// live lock of another kind holds the lock key (see Mutex.deadLock) or a
// live lock lies under the name (see Mutex.compatible).
func (m *Mutex) readChecked(ctx context.Context) (view, error) {
	v, err := m.read(ctx)
	if err == nil {
		err = m.deadLock(ctx, v.lock)
	}
	if err == nil {
		err = m.compatible(v)
	}
	return v, err
}

// read returns the subtree of the lock, in one transaction, after ops.
func (m *Mutex) read(ctx context.Context, ops ...*api.TxnOp) (view, error) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := m.s.txn(rctx, append(ops, kvOp(api.KVGetTree, m.prefix())))
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

// tailOps returns the operations that point the tail key at an entry of
// session, with value: delete it, then acquire it with session (plain: set
// it, with no session, for when a lock-delay refuses the acquire).
func (m *Mutex) tailOps(session string, value []byte, plain bool) api.TxnOps {
	write := &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.tailKey(), Session: session, Value: value}}
	if plain {
		write = &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVSet, Key: m.tailKey(), Value: value}}
	}
	return api.TxnOps{kvOp(api.KVDelete, m.tailKey()), write}
}

// relockTail acquires the tail key, written plain at index (see tailOps),
// with session once the lock-delay that refused that ends, naming the entry
// of session with CreateIndex entry, so that the key goes with that session.
// It runs in the session's background (core.Backoff, pauses up to
// delayRetryMax) until it succeeds, the tail key changes, or either session
// ends (docs/DESIGN.md, "Keys of a dead session", step 2).
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
	resp, err := m.s.txn(ctx, api.TxnOps{checkIndex(m.tailKey(), index),
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: m.tailKey(), Session: session, Value: fmt.Appendf(nil, "%s %d", session, entry)}}})
	var rb *rollback
	switch {
	case errors.As(err, &rb) && !rb.delayedOnly(1):
		return 0, nil // it changed, or the session ended: nothing to do
	case err != nil:
		return 0, err
	}
	var at uint64
	for _, r := range resp.Results {
		if r.KV != nil && r.KV.Key == m.tailKey() {
			at = max(at, r.KV.ModifyIndex)
		}
	}
	return at, nil
}
