package consul

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// linkWait bounds how long a release waits for a waiter that queued behind
// the holder to link itself (see lockHold.look), before it reads the whole
// queue instead.
const linkWait = 250 * time.Millisecond

// lockHold is the release state of a grant taken through the queue (a
// Mutex's, or an Election's with resign), used by its one release: the
// waiter linked behind us (nil: none known), the tail key's ModifyIndex
// when it last named our entry as far as we know (0: absent), and the index
// of our entry's subtree as last seen.
type lockHold struct {
	m         *Mutex
	resign    bool
	next      *waiter
	tailIndex uint64
	mine      uint64
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
	// Not core.Backoff: a stale attempt is not a failed request, and look
	// answers it at once (a pause would delay the handoff); after four,
	// errStale goes to the core's retry.
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
	err := g.m.s.releaseKey(ctx, g.m.lockKey())
	e, lerr := g.m.leave(ctx)
	if lerr != nil && (err == nil || errors.Is(err, holdfast.ErrNotHeld)) {
		return lerr
	}
	if lerr == nil && e != nil && e.Session == "" && e.Flags == api.LockFlagValue {
		_, _ = g.m.s.txn(ctx, api.TxnOps{deleteCAS(g.m.lockKey(), e.ModifyIndex)})
	}
	return err
}

// pass, the write behind Unlock, hands the lock to the waiter linked behind
// us in one transaction (docs/DESIGN.md, "Consul acquire", Unlock): guarded
// by our session holding the lock key and by the waiter's entry, it moves
// the key to the waiter's session and writes its held mark (with resign, an
// Election's, it deletes the key instead, and the woken waiter takes it).
// A failed check-session is an error wrapping holdfast.ErrNotHeld; a
// failed check of the waiter is errStale.
func (g *lockHold) pass(ctx context.Context) error {
	s, m, key, w := g.m.s, g.m, g.m.lockKey(), *g.next
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
	ops = append(ops, kvOp(api.KVDelete, w.key+prevInfix+s.id), kvOp(api.KVGetTree, m.queueKey()+nextInfix), kvOp(api.KVDeleteTree, m.queueKey()))
	return g.send(ctx, ops, held)
}

// alone releases the lock when nobody queued behind us: [check-session,
// check-index of the tail key at the index it had when it named our entry
// and its delete (or check that it is absent), delete the lock key, delete
// our entry and its subtree]. A waiter that queued behind us moved the tail
// key, or it went with that waiter's session: errStale.
func (g *lockHold) alone(ctx context.Context) error {
	m := g.m
	ops := releaseGuard(m.lockKey(), m.s.id)
	held := len(ops)
	if g.tailIndex == 0 {
		ops = append(ops, kvOp(api.KVCheckNotExists, m.tailKey()))
	} else {
		// A check-index, not a delete-cas (which succeeds on an absent
		// key): a tail key deleted with the session of a waiter that
		// queued behind us (Behavior delete) leaves that waiter's anchor
		// on us, which look's read then deletes (before, it stayed while
		// our session lived: TestExpiredSessionLeavesNothing).
		ops = append(ops, checkIndex(m.tailKey(), g.tailIndex), kvOp(api.KVDelete, m.tailKey()))
	}
	ops = append(ops, kvOp(api.KVDelete, m.lockKey()), kvOp(api.KVGetTree, m.queueKey()+nextInfix), kvOp(api.KVDeleteTree, m.queueKey()))
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
			if e := r.KV; e != nil && strings.HasPrefix(e.Key, g.m.queueKey()+nextInfix) && (g.next == nil || !strings.HasSuffix(e.Key, nextInfix+g.next.session)) {
				wake = appendWake(wake, e)
			}
		}
		_ = core.Retry(ctx, func(actx context.Context) error { return g.m.s.wake(actx, wake) })
		return nil
	case errors.As(err, &rb) && rb.denied():
		return txnError("unlock "+g.m.lockKey(), rb)
	case rb != nil && rb.failedBefore(held):
		return fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, g.m.lockKey(), g.m.s.id)
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
			pairs, index, err := m.s.watchTree(ctx, m.queueKey(), g.mine, linkWait-time.Since(start))
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
		return fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, m.lockKey(), m.s.id)
	}
	m.s.dropDead(ctx, v.dead)
	g.next, g.tailIndex = nil, 0
	for _, e := range v.queue {
		if e.Key != m.queueKey() {
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

// leave takes our entry out of the queue in two transactions that a retry
// can repeat whatever became of the last attempt (docs/DESIGN.md, "Consul
// acquire"): one reads our subtree, the lock key and the tail key and
// deletes our entry and its held mark; one wakes the waiters linked behind
// us (deleting their anchors on us) and deletes the rest of our subtree. A
// tail key naming us is repaired (see Mutex.repairTail). It returns the
// lock key as read.
func (m *Mutex) leave(ctx context.Context) (*api.KVPair, error) {
	s := m.s
	resp, err := s.txn(ctx, api.TxnOps{
		kvOp(api.KVGetTree, m.queueKey()), kvOp(api.KVGetOrEmpty, m.lockKey()), kvOp(api.KVGetOrEmpty, m.tailKey()),
		kvOp(api.KVDelete, m.queueKey()), kvOp(api.KVDelete, m.queueKey()+heldSuffix),
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
		case e.Key == m.lockKey():
			lock = e
		case e.Key == m.tailKey():
			tail = e
		case strings.HasPrefix(e.Key, m.queueKey()+"/"):
			wake = appendWake(wake, e)
		}
	}
	if len(wake) > 0 {
		wake = append(wake[:min(len(wake), MaxTxnOps-1)], kvOp(api.KVDeleteTree, m.queueKey()+"/"))
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

// appendWake appends to ops what wakes the waiter that e, a key under a
// queue entry E that is gone, stands for: for the link "E/next/W" of a
// live waiter W, the deletion of W's anchor "W/prev/E"; for E's anchor
// "E/prev/P", the deletion of E's link under P ("P/next/E").
func appendWake(ops api.TxnOps, e *api.KVPair) api.TxnOps {
	i := strings.LastIndex(e.Key, queueInfix)
	if i < 0 {
		return ops
	}
	prefix := e.Key[:i+len(queueInfix)]
	entry, sub, _ := strings.Cut(e.Key[i+len(queueInfix):], "/")
	if w, ok := strings.CutPrefix(sub, nextInfix[1:]); ok && w != "" && e.Session != "" {
		return append(ops, kvOp(api.KVDelete, prefix+w+prevInfix+entry))
	}
	if p, ok := strings.CutPrefix(sub, prevInfix[1:]); ok && p != "" {
		return append(ops, kvOp(api.KVDelete, prefix+p+nextInfix+entry))
	}
	return ops
}

// wake sends ops, wake-ups (see appendWake), at most MaxTxnOps of them.
func (s *Session) wake(ctx context.Context, ops api.TxnOps) error {
	if len(ops) == 0 {
		return nil
	}
	_, err := s.txn(ctx, ops[:min(len(ops), MaxTxnOps)])
	return err
}
