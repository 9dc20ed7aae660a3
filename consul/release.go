package consul

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// linkWait bounds a release's wait for the link of a waiter that queued
// behind the holder (acquisition.look).
const linkWait = 250 * time.Millisecond

// errStale means that the waiter we meant to hand the lock to, or the tail
// key, changed since we learnt them: look again.
var errStale = errors.New("the next waiter or the tail key changed")

// release ends a grant taken through the queue (see core.Grant): after
// Unlock it hands the lock over; after a loss it drops it.
func (a *acquisition) release(ctx context.Context, g *Grant) error {
	if !errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) {
		return a.drop(ctx, g)
	}
	// After a stale view, look at once (first waiting for a link); after
	// four, errStale goes to the core's retry.
	first := true
	err := core.Backoff{First: time.Nanosecond, Tries: 4, Final: func(err error) bool { return !errors.Is(err, errStale) }}.Retry(ctx, func(ctx context.Context) error {
		if err := a.handOver(ctx); !errors.Is(err, errStale) {
			return err
		}
		err := a.look(ctx, first)
		first = false
		return cmp.Or(err, errStale)
	})
	if errors.Is(err, holdfast.ErrNotHeld) { // deleted or taken over from outside
		a.m.s.checkSoon()
		if _, lerr := a.m.leave(ctx); lerr != nil {
			return lerr
		}
	}
	return err
}

// drop releases the lock key, then cleans up as after a failed Lock
// (Mutex.clean: after a loss, or on Close).
func (a *acquisition) drop(ctx context.Context, _ *Grant) error {
	err := a.m.s.releaseKey(ctx, a.m.lockKey())
	if cerr := a.m.clean(ctx); cerr != nil && (err == nil || errors.Is(err, holdfast.ErrNotHeld)) {
		return cerr
	}
	return err
}

// handOver, the write behind Unlock, hands the lock key to the waiter w
// linked behind us, or deletes it if the tail key still names us
// (docs/DESIGN.md, "Consul acquire", Unlock). It fails with
// holdfast.ErrNotHeld, or errStale if w or the tail changed.
func (a *acquisition) handOver(ctx context.Context) error {
	m, key, w := a.m, a.m.lockKey(), a.next
	ops := releaseGuard(key, m.s.id)
	held := len(ops) // ops before held check that we hold the key
	switch {
	case w == nil && a.tailIndex == 0:
		ops = append(ops, kvOp(api.KVCheckNotExists, m.tailKey()), kvOp(api.KVDelete, key))
	case w == nil:
		// A check-index, not a delete-cas, which passes on an absent key
		// (TestExpiredSessionLeavesNothing).
		ops = append(ops, checkIndex(m.tailKey(), a.tailIndex), kvOp(api.KVDelete, m.tailKey()), kvOp(api.KVDelete, key))
	case a.campaign():
		ops = append(ops, kvOp(api.KVDelete, key), kvOp(api.KVDelete, w.key+prevInfix+m.s.id))
	default: // a delete and a lock: the key is never seen free
		ops = append(append(ops, kvOp(api.KVDelete, key), lockOp(key, w.session, []byte(valueTaken))), nextGuard(*w)...)
		ops = append(ops, acquireOp(w.key+heldSuffix, w.session, nil), kvOp(api.KVDelete, w.key+prevInfix+m.s.id))
	}
	resp, err := m.s.txn(ctx, append(ops, kvOp(api.KVGetTree, m.queueKey()+nextInfix), kvOp(api.KVDeleteTree, m.queueKey())))
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.denied():
		return txnError("unlock "+key, rb)
	case rb != nil && rb.failedBefore(held):
		return fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, key, m.s.id)
	case rb != nil:
		a.next = nil
		return errStale
	case err != nil:
		return err
	}
	// The other waiters linked under us (one that relinked after a read)
	// are woken: their anchors on us go.
	var wake api.TxnOps
	for _, e := range txnKVs(resp.Results) {
		if strings.HasPrefix(e.Key, m.queueKey()+nextInfix) && (w == nil || !strings.HasSuffix(e.Key, nextInfix+w.session)) {
			wake = appendWake(wake, e)
		}
	}
	_ = core.Retry(ctx, func(ctx context.Context) error { return m.s.wake(ctx, wake) })
	return nil
}

// look learns whom to hand the lock to: if wait, from a link behind us
// within linkWait; else from a read of the queue (none: the tail key's
// index). holdfast.ErrNotHeld: our session no longer holds the key.
func (a *acquisition) look(ctx context.Context, wait bool) error {
	m := a.m
	for start := time.Now(); wait && time.Since(start) < linkWait; {
		pairs, index, err := m.s.watchTree(ctx, m.queueKey(), a.mine, linkWait-time.Since(start))
		if err != nil {
			return err
		}
		if pairs == nil && index == a.mine {
			break // no link came
		}
		a.mine, a.next = index, m.parse(pairs).next
		if a.next != nil {
			return nil
		}
	}
	v, err := m.read(ctx)
	if err != nil {
		return err
	}
	if v.lock == nil || v.lock.Session != m.s.id {
		return fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, m.lockKey(), m.s.id)
	}
	a.next, a.tailIndex = nil, 0
	for _, e := range v.queue {
		if e.Key != m.queueKey() {
			w := m.entry(e.Session, e.CreateIndex)
			a.next = &w
			return nil
		}
	}
	if v.tail != nil {
		a.tailIndex = v.tail.ModifyIndex
	}
	return nil
}

// leave takes our entry out of the queue in two transactions that a retry
// can repeat, and repairs a tail key naming us (docs/DESIGN.md, "Consul
// acquire"). It returns the lock key.
func (m *Mutex) leave(ctx context.Context) (*api.KVPair, error) {
	resp, err := m.s.txn(ctx, api.TxnOps{
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
	for _, e := range txnKVs(resp.Results) {
		switch {
		case e.ModifyIndex == 0:
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
		if _, err := m.s.txn(ctx, wake); err != nil {
			return nil, err
		}
	}
	if t, ok := m.tailEntry(tail); ok && t.session == m.s.id {
		return lock, m.repairTail(ctx)
	}
	return lock, nil
}

// appendWake appends what wakes the waiter that e, a key under a gone queue
// entry E, stands for: for the link "E/next/W" of a live W, the deletion of
// W's anchor "W/prev/E"; for E's anchor "E/prev/P", of "P/next/E".
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
