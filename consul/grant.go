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
	"github.com/holdfast/holdfast/internal/mutant"
)

// Grant is a held Consul lock. It implements holdfast.Grant.
//
// A Consul grant is "our session holds the lock key": it lasts while the
// key "<name>/.lock" has our session (Consul's Session field), from the write
// that acquired it until Unlock or a loss. Within one session, only one grant
// of a name exists at a time (the session frees the name only after the
// grant's release reached Consul), so the session alone identifies the
// grant. Accordingly:
//
//   - Unlock, and the handoff to the next waiter, are guarded by a
//     check-session of the lock key, not by its index;
//   - a write to the key that keeps our session (a "poke" such as Consul's
//     own lock tests make, KV().Put of the pair with a new value) does not
//     end the grant, and Unlock still frees the key;
//   - the key's flags are not part of the guard (Consul's transactions
//     cannot check them, and api.Lock's monitor does not either); a lock
//     key found with other flags is refused by the next Lock, with
//     holdfast.ErrConflict;
//   - the grant is lost when the session ends, or when the key is deleted or
//     taken over by another session from outside; the session notices that
//     within TTL/3 (see Session).
//
// The token is the ModifyIndex of the write that acquired the key (a Raft
// index, so tokens of successive grants strictly increase); it does not
// change when the key is poked.
//
// A Semaphore's permit and an RWMutex's read or write grant are Grants too,
// with the holder's contender key "<name>/<session ID>" in place of the lock
// key: Key returns it, Guard and Txn check that our session holds it, the
// session's check of held keys watches it, and Unlock removes us from the
// holders (handing the permit on) and deletes it. Their token is the
// ModifyIndex of the lock-key write that admitted them (see Semaphore).
type Grant struct {
	base   *core.Grant // key, token, context, reentrancy, release
	s      *Session
	prefix string // "<name>/": the primitive's own keys, which Txn refuses
	m      *Mutex // a Mutex's grant; nil for a permit (see permit)
	// permit is set on a Semaphore's or RWMutex's grant: what its release
	// and Downgrade need (see permits.go).
	permit *permitHold

	// Used only by the release, which runs once, in one goroutine: whom to
	// hand the lock to (up to two waiters, in queue order), and the lock
	// key's ModifyIndex as we last saw it; the tail key as we last read it
	// (nil if absent; tailKnown: read at all), and whether that read showed
	// no live waiter behind us (alone); the CreateIndex of our last queue
	// entry, if we queued.
	next      []waiter
	index     uint64
	tail      *api.KVPair
	tailKnown bool
	alone     bool
	queued    uint64
	// plain: an election's grant, released by a guarded delete, never
	// handed over (the lock key's value is the leader's).
	plain bool
}

var _ holdfast.Grant = (*Grant)(nil)

// Key implements holdfast.Grant: the lock key, "<name>/.lock" (a permit's:
// its contender key, "<name>/<session ID>").
func (g *Grant) Key() string { return g.base.Key() }

// Token implements holdfast.Grant.
func (g *Grant) Token() holdfast.Token { return g.base.Token() }

// Context implements holdfast.Grant.
func (g *Grant) Context() context.Context { return g.base.Context() }

// Deadline implements holdfast.Grant.
func (g *Grant) Deadline() time.Time { return g.base.Deadline() }

// Unlock implements holdfast.Grant. When holdfast waiters queue, it hands the
// lock directly to the head of the queue (whenever that waiter queued), in
// one transaction; otherwise it deletes the lock key. Either way the write is
// guarded by our session holding the key. It costs one request when the
// grant knows the head of the queue or that nobody waits; one more (a read
// of the lock key and the tail key) when the lock was handed to it without
// naming a successor, and two more when it took the free lock and a waiter
// queued afterwards (the guess that nobody waits fails first). The waiters
// that queued after the lock was acquired announce themselves in the lock
// key once they see it held; if one has not yet, Unlock waits for that (at
// most 250 ms) and otherwise reads the whole queue.
func (g *Grant) Unlock(ctx context.Context) error { return g.base.Unlock(ctx) }

// Session returns the ID of the Consul session that holds the grant.
func (g *Grant) Session() string { return g.s.id }

// Guard returns the operation that succeeds exactly while this grant is
// held: a check-session of the lock key on our session. Put it first in
// your own /v1/txn transactions; Txn does it for you.
func (g *Grant) Guard() api.TxnOps {
	return api.TxnOps{checkSession(g.Key(), g.s.id)}
}

// Txn runs ops in one Consul transaction (/v1/txn) that applies only while
// the grant is held, checked by Consul in the same transaction (see Guard).
//
// ops must not touch the lock's own keys (anything under "<name>/": the
// lock key and the queue), nor delete a tree that holds them: such ops
// (even reads) are refused with an error wrapping
// holdfast.ErrInvalidArgument before any request, as are an empty list, more
// than MaxTxnOps-1 ops, and nil ops.
//
// If the grant was released or lost, locally or in Consul, nothing is
// applied and the error wraps holdfast.ErrNotHeld (a guard that fails in
// Consul also ends the grant, and makes the session check its other keys).
// If one of ops fails (a cas on a stale index, say), nothing is applied
// either: the error describes the failures, and the response is returned
// too, with the indexes in its Errors counted in ops. On success the
// response's Results are those of ops (the guard's is removed). An ACL
// refusal is an error wrapping holdfast.ErrPermissionDenied. If the request
// itself fails (a network error, or ctx or the 10 s client-side timeout ends
// first), the transaction may or may not have been applied, as with any
// Consul write.
func (g *Grant) Txn(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if err := g.checkOps(ops); err != nil {
		return nil, err
	}
	if !g.base.Held() {
		return nil, g.base.NotHeld()
	}
	guard := api.TxnOps{}
	if !mutant.On("consul/txn-check-session") {
		guard = g.Guard()
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := g.s.txn(ctx, append(guard, ops...))
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.failedBefore(len(guard)):
		if rb.denied() {
			return nil, txnError("guarded transaction on "+g.Key(), rb)
		}
		g.base.Lose(fmt.Errorf("%w: %s is no longer held by session %s (a guarded transaction failed its check)", holdfast.ErrLost, g.Key(), g.s.id))
		g.s.checkSoon()
		return nil, g.base.NotHeld()
	case rb != nil:
		for _, e := range resp.Errors {
			e.OpIndex -= len(guard)
		}
		return resp, txnError("guarded transaction on "+g.Key(), rb)
	case err != nil:
		return nil, err
	}
	if len(resp.Results) >= len(guard) {
		resp.Results = resp.Results[len(guard):]
	}
	return resp, nil
}

// checkOps refuses what Txn must not send (see Txn).
func (g *Grant) checkOps(ops api.TxnOps) error {
	if len(ops) == 0 || len(ops)+1 > MaxTxnOps {
		return fmt.Errorf("%w: %d operations; a guarded transaction takes 1 to %d", holdfast.ErrInvalidArgument, len(ops), MaxTxnOps-1)
	}
	for i, op := range ops {
		switch {
		case op == nil:
			return fmt.Errorf("%w: operation %d is nil", holdfast.ErrInvalidArgument, i)
		case op.KV != nil && strings.HasPrefix(op.KV.Key, g.prefix):
			return fmt.Errorf("%w: operation %d (%s %s) touches the lock's own keys, under %s", holdfast.ErrInvalidArgument, i, op.KV.Verb, op.KV.Key, g.prefix)
		case op.KV != nil && op.KV.Verb == api.KVDeleteTree && strings.HasPrefix(g.prefix, op.KV.Key):
			return fmt.Errorf("%w: operation %d deletes the tree %q, which holds the lock's own keys", holdfast.ErrInvalidArgument, i, op.KV.Key)
		}
	}
	return nil
}

// lose ends the grant after the check of held keys found its key e (never
// nil: get-or-empty) not held by our session.
func (g *Grant) lose(e *api.KVPair) {
	why := "deleted"
	switch {
	case e.Session != "":
		why = "taken over by session " + e.Session
	case e.ModifyIndex != 0:
		why = "released"
	}
	g.base.Lose(fmt.Errorf("%w: %s was %s from outside", holdfast.ErrLost, g.Key(), why))
}

// errStale means that the lock key or the waiter we meant to hand it to
// changed since we last read them: read the queue again.
var errStale = errors.New("the lock key or its next waiter changed")

// announceWait bounds how long a release waits for a waiter that queued
// behind the holder to announce itself (see Grant.look), before it reads
// the whole queue instead.
const announceWait = 250 * time.Millisecond

// release ends the grant in Consul; the session runs it in the background
// (see core.Grant), retried on transport errors while the session lives.
// After Unlock it hands the lock over (see handOver) or deletes the key.
// When the grant does not know whom to hand it to, or that nobody waits,
// or the key changed since (a waiter announced itself), it first reads the
// lock key and the tail key (see look), and the whole queue only if that
// does not tell. After a loss it deletes the key if our session still holds
// it (see Session.releaseKey).
func (g *Grant) release(ctx context.Context) error {
	s := g.m.s
	var err error
	switch {
	case !g.plain && errors.Is(context.Cause(g.Context()), holdfast.ErrReleased):
		err = errStale
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
			s.checkSoon()
		}
	default: // an election's grant, a lost one, or the session ends
		err = g.releasePlain(ctx)
	}
	if err == nil || core.Final(err) {
		s.forget(g)
	}
	return err // errStale four times over: retried
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
func (g *Grant) handOver(ctx context.Context) error {
	s, m, key := g.m.s, g.m, g.Key()
	var ops api.TxnOps
	if !mutant.On("consul/release-check-session") {
		ops = append(ops, checkSession(key, s.id))
	}
	held := len(ops) // ops before this index check that we hold the key
	switch {
	case len(g.next) > 0:
		w := g.next[0]
		ops = append(ops,
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: key, Flags: api.LockFlagValue, Session: s.id}},
			lockOp(key, w.session, nextValue(g.next[1:])))
		if mutant.On("consul/handoff-check-next") {
			ops = append(ops, kvOp(api.KVDelete, w.key))
		} else {
			ops = append(ops, checkSession(w.key, w.session), deleteCAS(w.key, w.index))
		}
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
func (g *Grant) look(ctx context.Context) error {
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
func (g *Grant) refresh(ctx context.Context) error {
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

// releasePlain releases the lock key without handing it over (an
// election's grant, a lost grant, a grant whose session ends):
// [check-session, delete] of the lock key (see Session.releaseKey), which
// reads the tail key too; if the tail key names our own last queue entry
// (nobody queued after us), it is deleted, if unchanged.
func (g *Grant) releasePlain(ctx context.Context) error {
	s, m := g.m.s, g.m
	var ops api.TxnOps
	if !mutant.On("consul/release-check-session") {
		ops = append(ops, checkSession(m.lockKey, s.id))
	}
	ops = append(ops, kvOp(api.KVDelete, m.lockKey), kvOp(api.KVGetOrEmpty, m.tailKey))
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
			if t, ok := m.tailEntry(e); ok && t.session == s.id && t.index == g.queued {
				_, _ = s.txn(ctx, api.TxnOps{deleteCAS(m.tailKey, e.ModifyIndex)})
			}
		}
	}
	return nil
}

// releaseKey deletes key if our session holds it: [check-session, delete].
// It releases what the session holds outside any live grant: the key of a
// lost grant, of a failed acquisition, and on Close. It returns an error
// wrapping holdfast.ErrNotHeld if the check fails.
func (s *Session) releaseKey(ctx context.Context, key string) error {
	var ops api.TxnOps
	if !mutant.On("consul/release-check-session") {
		ops = append(ops, checkSession(key, s.id))
	}
	ops = append(ops, kvOp(api.KVDelete, key))
	_, err := s.txn(ctx, ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.denied():
		return txnError("release "+key, rb)
	case rb != nil:
		return fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, key, s.id)
	}
	return err
}
