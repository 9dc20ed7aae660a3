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
	base   *core.Grant // key, token, context, reentrancy; ends it through ending
	s      *Session
	prefix string   // "<name>/": the primitive's own keys, which Txn refuses
	rel    releaser // how the grant's algorithm ends it in Consul
}

// releaser is a grant's end in Consul, by its algorithm: lockHold
// (release.go: a Mutex's, with resign an Election's) or permitHold
// (permitleave.go: a Semaphore's or RWMutex's).
type releaser interface {
	// release ends g in Consul after Unlock or a loss (see core.Releaser).
	release(ctx context.Context, g *Grant) error
	// drop ends g as its session closes: no handoff, the key goes.
	drop(ctx context.Context, g *Grant) error
}

// ending is a Grant as internal/core ends it.
type ending Grant

// Release implements core.Releaser: the algorithm's release (g.rel); once
// it is done, or cannot be done, the session forgets the grant.
func (e *ending) Release(ctx context.Context) error {
	g := (*Grant)(e)
	err := g.rel.release(ctx, g)
	if err == nil || core.Final(err) {
		g.s.forget(g)
	}
	return err
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
// lock directly to the next one, in one transaction; otherwise it deletes the
// lock key. Either way the write is guarded by our session holding the key.
// It costs one request when the grant knows the next waiter (the waiter
// linked itself behind us) or that nobody queued behind us; when a waiter
// queued but has not linked itself yet, Unlock waits for its link (at most
// 250 ms) and otherwise reads the whole queue.
func (g *Grant) Unlock(ctx context.Context) error { return g.base.Unlock(ctx) }

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
	return g.s.guardedTxn(ctx, g.Key(), txnGuard(g.Key(), g.s.id), ops, func() error {
		g.base.Lose(fmt.Errorf("%w: %s is no longer held by session %s (a guarded transaction failed its check)", holdfast.ErrLost, g.Key(), g.s.id))
		g.s.checkSoon()
		return g.base.NotHeld()
	})
}

// guardedTxn sends guard, then ops, in one transaction for Txn on what.
// If guard fails, the error is lost's (an ACL refusal's, if it was one);
// if one of ops fails, the response is returned too, its Errors indexed in
// ops. On success the response's Results are those of ops.
func (s *Session) guardedTxn(ctx context.Context, what string, guard, ops api.TxnOps, lost func() error) (*api.TxnResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := s.txn(ctx, append(guard, ops...))
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.failedBefore(len(guard)) && !rb.denied():
		return nil, lost()
	case rb != nil && rb.failedBefore(len(guard)):
		return nil, txnError("guarded transaction on "+what, rb)
	case rb != nil:
		for _, e := range resp.Errors {
			e.OpIndex -= len(guard)
		}
		return resp, txnError("guarded transaction on "+what, rb)
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

// releaseKey deletes key if our session holds it: [check-session, delete].
// It releases what the session holds outside any live grant: the key of a
// lost grant, of a failed acquisition, and on Close. It returns an error
// wrapping holdfast.ErrNotHeld if the check fails.
func (s *Session) releaseKey(ctx context.Context, key string) error {
	ops := append(releaseGuard(key, s.id), kvOp(api.KVDelete, key))
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
