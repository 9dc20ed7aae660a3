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

// The pauses at the head while a lock-delay of unknown end refuses the take.
const (
	delayRetry    = 25 * time.Millisecond
	delayRetryMax = 500 * time.Millisecond
)

// acquisition is one Lock, TryLock or Campaign in progress, then its
// grant's releaser (release.go).
type acquisition struct {
	m     *Mutex
	value []byte // a Campaign's proposal (campaign.go); nil for a Mutex
	// CreateIndex of our first and latest entry; the tail key's ModifyIndex
	// as we set it (plainTail: see relockTail); a write got no answer.
	since, queueIndex, tailIndex uint64
	plainTail, uncertain         bool
	// The entry ahead of ours (nil: the head); our link and anchor on it
	// are written; we must read the queue.
	pred         *waiter
	linked, lost bool
	mine         uint64  // the index of our entry's subtree as last seen
	next         *waiter // linked behind us: whom the grant hands the lock to
	delay        lockDelay
}

// campaign reports whether this is an Election's Campaign.
func (a *acquisition) campaign() bool { return a.value != nil }

// join is the waiting algorithm (TryLock's if try) and returns the token;
// steps as in docs/DESIGN.md ("Consul acquire").
func (a *acquisition) join(ctx context.Context, try bool) (uint64, error) {
	if try {
		return a.try(ctx)
	}
	names, err := a.list(ctx) // 1. nothing under the name: take it
	if err != nil {
		return 0, err
	}
	if len(names) == 0 {
		if token, _, err := a.take(ctx, nil, nil, true); err != nil || token != 0 {
			return token, err
		}
	}
	lock, err := a.enqueue(ctx) // 2. queue up
	if err != nil {
		return 0, err
	}
	return a.wait(ctx, lock)
}

// try is TryLock's step 1: it takes the lock only if it is free and no live
// entry queues, else fails with holdfast.ErrLocked.
func (a *acquisition) try(ctx context.Context) (uint64, error) {
	v, err := a.m.readChecked(ctx)
	if err != nil {
		return 0, err
	}
	if free(v.lock) && v.waiting() == 0 {
		token, delayed, err := a.take(ctx, v.lock, v.tail, true)
		if err != nil || token != 0 {
			return token, err
		}
		if delayed {
			return 0, fmt.Errorf("%w: %s is in its lock-delay after its holder's session ended", holdfast.ErrLocked, a.m.name)
		}
	}
	return 0, fmt.Errorf("%w: %s is held or waited for", holdfast.ErrLocked, a.m.name)
}

// wait runs steps 3 to 6 from lock, the lock key as last read.
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
		case a.lost: // 3. with a read
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

// reread is step 3 with a read (dropping our old link); our entry gone:
// step 2. It returns the lock key.
func (a *acquisition) reread(ctx context.Context) (*api.KVPair, error) {
	m := a.m
	var drop api.TxnOps
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
	a.lost, a.pred, a.linked = false, nil, false
	switch {
	case a.handedToUs(v.lock):
	case v.me == nil || v.me.CreateIndex != a.queueIndex:
		return a.enqueue(ctx) // if our session is gone, Consul says so
	default:
		a.next = v.next
		if p := v.predecessor(); p != nil {
			w := m.entry(p.Session, p.CreateIndex)
			a.pred = &w
		}
	}
	return v.lock, nil
}

// block is steps 4 and 5: it waits for our entry's subtree to change, and
// returns the token if it holds our held mark.
func (a *acquisition) block(ctx context.Context) (uint64, error) {
	pairs, index, err := a.m.s.watchTree(ctx, a.m.queueKey(), a.mine, 0)
	if err != nil {
		return 0, err
	}
	a.mine = index
	v := a.m.parse(pairs)
	if v.anchor != nil && !strings.HasSuffix(v.anchor.Key, prevInfix+a.pred.session) {
		v.anchor = nil
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
		// It left, or its session ended (its lock-delay starts if it held).
		a.delay.from(v.anchor != nil && a.delay.holder == a.pred.session)
		a.lost = true
	}
	return 0, nil
}

// atHead is step 6: it waits for the lock key, lock as last read, to be
// free, then takes it; it returns the token, or the lock key to look at.
func (a *acquisition) atHead(ctx context.Context, lock *api.KVPair) (uint64, *api.KVPair, error) {
	m := a.m
	if !free(lock) {
		lock, err := a.waitRelease(ctx, lock)
		return 0, lock, err
	}
	if err := m.deadLock(ctx, lock); err != nil {
		return 0, nil, err
	}
	token, delayed, err := a.take(ctx, lock, nil, false)
	switch {
	case err != nil || token != 0:
		return token, nil, err
	case delayed:
		if !core.Sleep(ctx, a.delay.left()) {
			return 0, nil, ctx.Err()
		}
		return 0, lock, nil
	}
	lock, err = m.s.get(ctx, m.lockKey(), false) // busy: a foreign client took it
	return 0, lock, err
}

// handedToUs reports whether lock is held by our session through a write
// after we queued: a handoff to us (older: a stale read).
func (a *acquisition) handedToUs(lock *api.KVPair) bool {
	return a.since != 0 && lock != nil && lock.Session == a.m.s.id && tokenOf(lock) > a.since
}

// send sends one of our writes, bounded by requestTimeout; one without
// answer makes us uncertain.
func (a *acquisition) send(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	resp, err := a.m.s.txn(ctx, ops)
	var rb *rollback
	if err != nil && !errors.As(err, &rb) {
		a.uncertain = true
	}
	return resp, err
}

// link is step 3: our link under our predecessor P and our anchor on P,
// guarded by P's entry; it learns P's lock-delay. A failed guard: read next.
func (a *acquisition) link(ctx context.Context) error {
	m, p := a.m, a.pred
	resp, err := a.send(ctx, api.TxnOps{
		checkIndex(p.key, p.index),
		kvOp(api.KVGet, p.key), // a check's answer carries no value
		acquireOp(p.key+nextInfix+m.s.id, m.s.id, strconv.AppendUint(nil, a.queueIndex, 10)),
		acquireOp(m.queueKey()+prevInfix+p.session, p.session, nil),
	})
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.denied():
		return txnError("queue up on "+m.name, rb)
	case rb != nil:
		a.lost = true
		return nil
	case err != nil:
		return err
	}
	a.delay.holder, a.delay.known = p.session, false
	for _, e := range txnKVs(resp.Results) {
		if e.Key != p.key {
			a.mine = max(a.mine, e.ModifyIndex)
		} else if ms, err := strconv.ParseInt(string(e.Value), 10, 64); err == nil && ms >= 0 {
			a.delay.delay, a.delay.known = time.Duration(ms)*time.Millisecond, true // its value
		}
	}
	a.linked = true
	return nil
}

// waitRelease blocks until the held lock key changes and returns it,
// having learnt the holder's lock-delay while its session exists.
func (a *acquisition) waitRelease(ctx context.Context, lock *api.KVPair) (*api.KVPair, error) {
	if lock.Session != a.delay.holder {
		a.delay.holder = lock.Session
		a.delay.delay, a.delay.known = a.m.s.lockDelayOf(ctx, lock.Session)
	}
	next, err := a.m.s.watchKey(ctx, a.m.lockKey(), lock.ModifyIndex, 0)
	if err == nil && free(next) {
		a.delay.from(true)
	}
	return next, err
}

// lockDelay is what a waiter knows of the lock-delay that may follow a
// release (docs/DESIGN.md, "Keys of a dead session", step 4).
type lockDelay struct {
	holder       string
	delay, pause time.Duration
	known, guess bool
	notBefore    time.Time
}

// from forgets the end we waited for; if started, the holder's starts now.
func (d *lockDelay) from(started bool) {
	d.notBefore, d.guess, d.pause = time.Time{}, false, 0
	if started && d.known {
		d.notBefore = time.Now().Add(d.delay)
	}
}

// left is how long to wait after a lock-delay refusal: until the end of
// the delay we saw start; else a pause doubling from delayRetry to
// delayRetryMax, cut at a guessed end (TestWokenWaiterHolderDelay).
func (d *lockDelay) left() time.Duration {
	if d.notBefore.IsZero() && d.known {
		// Our predecessor's anchor was deleted: if it held last, its delay
		// started at most now.
		d.notBefore, d.guess = time.Now().Add(d.delay), true
	}
	rest := time.Until(d.notBefore)
	if rest > 0 && !d.guess {
		return min(rest, MaxLockDelay)
	}
	p := max(d.pause, delayRetry)
	d.pause = min(2*p, delayRetryMax)
	if rest > 0 {
		p = min(p, rest)
	}
	return p
}

// take acquires the lock key as seen and reads our subtree (whom to hand
// to); first (step 1), it also queues us, guarded by the tail as seen. The
// token is that write's index (0: busy, or delayed by a lock-delay).
func (a *acquisition) take(ctx context.Context, seen, tail *api.KVPair, first bool) (token uint64, delayed bool, err error) {
	m := a.m
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
		return 0, false, txnError("acquire "+m.lockKey(), rb)
	case rb != nil && !rb.lockDelayed() && rb.sessionGone():
		return 0, false, m.s.ended()
	case rb != nil:
		return 0, rb.lockDelayed(), nil
	case err != nil:
		return 0, false, err
	}
	v := m.parse(txnKVs(resp.Results))
	if v.lock == nil || v.lock.Session != m.s.id || v.me == nil {
		a.uncertain = true // the key may be ours: clean up
		return 0, false, errors.New("holdfast/consul: acquire: Consul's answer has no lock entry of ours")
	}
	if first {
		a.queued(v.me, plain)
	} else if a.plainTail {
		// The lock-delay that refused the tail key is likely over too.
		if at, _ := m.relockTailOnce(ctx, m.s.id, a.queueIndex, a.tailIndex); at != 0 {
			a.tailIndex, a.plainTail = at, false
		}
	}
	a.next, a.mine = v.next, max(a.mine, v.lock.ModifyIndex)
	return v.lock.ModifyIndex, false, nil
}

// queueOps creates our entry (replacing a leftover's subtree), its value
// our lock-delay in ms, and points the tail key at it.
func (m *Mutex) queueOps(plain bool) api.TxnOps {
	delay := strconv.AppendInt(nil, m.s.cfg.lockDelay.Milliseconds(), 10)
	return append(api.TxnOps{kvOp(api.KVDeleteTree, m.queueKey()), acquireOp(m.queueKey(), m.s.id, delay)},
		m.tailOps(m.s.id, []byte(m.s.id), plain)...)
}

// sendTail sends ops(false) with send, bounded by requestTimeout; if a
// lock-delay refused only the tail key's acquire, it sends ops(true) (the
// tail written plain) and reports so.
func (m *Mutex) sendTail(ctx context.Context, send func(context.Context, api.TxnOps) (*api.TxnResponse, error), ops func(plain bool) api.TxnOps) (resp *api.TxnResponse, plain bool, err error) {
	for {
		o := ops(plain)
		resp, err = send(ctx, o)
		tailAt := slices.IndexFunc(o, func(op *api.TxnOp) bool { return op.KV.Verb == api.KVLock && op.KV.Key == m.tailKey() })
		var rb *rollback
		if plain || tailAt < 0 || !errors.As(err, &rb) || !rb.delayedOnly(tailAt) {
			return resp, plain, err
		}
		plain = true
	}
}

// queued notes our entry me, just created, as the tail key names it.
func (a *acquisition) queued(me *api.KVPair, plain bool) {
	a.queueIndex, a.tailIndex = me.CreateIndex, me.CreateIndex
	if a.since == 0 {
		a.since = me.CreateIndex
	}
	a.plainTail = plain
	if plain {
		a.m.relockTail(a.m.s.id, a.queueIndex, a.tailIndex)
	}
}

// enqueue is step 2: one transaction reads the tail key (naming our
// predecessor) and points it at our new entry, and reads the lock key.
func (a *acquisition) enqueue(ctx context.Context) (*api.KVPair, error) {
	m := a.m
	resp, plain, err := m.sendTail(ctx, a.send, func(plain bool) api.TxnOps {
		ops := api.TxnOps{kvOp(api.KVGetOrEmpty, m.tailKey()), kvOp(api.KVGetTree, m.queueKey()+"/")}
		return append(append(ops, m.queueOps(plain)...), kvOp(api.KVGetOrEmpty, m.lockKey()))
	})
	var rb *rollback
	switch {
	case errors.As(err, &rb) && !rb.denied() && (rb.sessionGone() || rb.lockDelayed()):
		return nil, m.s.ended() // our own entry is lock-delayed only if our session was invalidated
	case rb != nil:
		return nil, txnError("queue up on "+m.name, rb)
	case err != nil:
		return nil, err
	}
	var tail, me, lock *api.KVPair
	var wake api.TxnOps // wakes those linked behind a leftover entry of ours
	for _, e := range txnKVs(resp.Results) {
		switch {
		case e.Key == m.tailKey() && tail == nil:
			tail = e // the first answer: its value before ours
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
	a.mine, a.pred, a.linked, a.lost, a.next = me.CreateIndex, nil, false, false, nil
	if p, ok := m.tailEntry(tail); ok { // our predecessor (ours: read the queue)
		a.pred, a.lost = &p, p.session == m.s.id
	} else if tail != nil && tail.ModifyIndex != 0 {
		a.lost = true // an unreadable tail
	}
	if lock != nil && lock.Session == m.s.id && !a.handedToUs(lock) {
		// Handed to a leftover entry of ours: no grant holds it.
		if err := m.s.releaseKey(ctx, m.lockKey()); err != nil && !errors.Is(err, holdfast.ErrNotHeld) {
			return nil, err
		}
		lock, a.lost = nil, true
	}
	return lock, m.s.wake(ctx, wake)
}

// list returns the names right under "<name>/"; with one not the lock's
// own, it reads the subtree (see readChecked).
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
			_, err := m.readChecked(ctx)
			return names, err
		}
	}
	return names, nil
}

// readChecked reads the subtree, failing if a live lock of another kind
// holds the key (Mutex.deadLock) or lies under it (Mutex.compatible).
func (m *Mutex) readChecked(ctx context.Context) (view, error) {
	v, err := m.read(ctx)
	if err != nil {
		return v, err
	}
	return v, cmp.Or(m.deadLock(ctx, v.lock), m.compatible(v))
}

// read returns the subtree of the lock, in one transaction, after ops, and
// drops the keys of gone sessions it shows (Session.dropDead).
func (m *Mutex) read(ctx context.Context, ops ...*api.TxnOp) (view, error) {
	resp, err := m.s.txn(ctx, append(ops, kvOp(api.KVGetTree, m.prefix())))
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return view{}, txnError("read "+m.name, rb)
	case err != nil:
		return view{}, err
	}
	v := m.parse(txnKVs(resp.Results))
	m.s.dropDead(ctx, v.dead)
	return v, nil
}

// tailOps points the tail key at an entry of session, with value: delete
// it, then acquire it with session (plain: set it, for when a lock-delay
// refuses the acquire).
func (m *Mutex) tailOps(session string, value []byte, plain bool) api.TxnOps {
	write := acquireOp(m.tailKey(), session, value)
	if plain {
		write = &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVSet, Key: m.tailKey(), Value: value}}
	}
	return api.TxnOps{kvOp(api.KVDelete, m.tailKey()), write}
}

// relockTail acquires the tail key, written plain at index, with session,
// in the background (docs/DESIGN.md, "Keys of a dead session", step 2).
func (m *Mutex) relockTail(session string, entry, index uint64) {
	m.s.bg.Go(func(ctx context.Context) {
		_ = core.Backoff{Attempt: requestTimeout, First: delayRetry, Max: delayRetryMax}.Retry(ctx, func(ctx context.Context) error {
			_, err := m.relockTailOnce(ctx, session, entry, index)
			return err
		})
	})
}

// relockTailOnce is one attempt of relockTail: the tail key's new index
// (0: not acquired), an error if it is to be retried.
func (m *Mutex) relockTailOnce(ctx context.Context, session string, entry, index uint64) (uint64, error) {
	resp, err := m.s.txn(ctx, api.TxnOps{checkIndex(m.tailKey(), index),
		acquireOp(m.tailKey(), session, fmt.Appendf(nil, "%s %d", session, entry))})
	var rb *rollback
	switch {
	case errors.As(err, &rb) && !rb.delayedOnly(1):
		return 0, nil // it changed, or a session ended: nothing to do
	case err != nil:
		return 0, err
	}
	if tail := m.parse(txnKVs(resp.Results)).tail; tail != nil { // the acquire's answer
		return tail.ModifyIndex, nil
	}
	return 0, nil
}
