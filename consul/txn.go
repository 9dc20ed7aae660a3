package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// MaxTxnOps is the most operations Consul accepts in one transaction. Grant.Txn
// adds its guard to yours, so it takes up to MaxTxnOps - 2.
const MaxTxnOps = 128

// Grant is a held Consul lock. It implements holdfast.Grant: its key is
// "<name>/.lock", acquired with the session, and its token is the
// ModifyIndex of the write that acquired it (a Raft index, so tokens of
// successive grants strictly increase).
type Grant struct {
	base  *core.Grant // key, token, context, reentrancy, release
	s     *Session
	token uint64
	next  *api.KVPair // the waiter to hand the lock to on Unlock, if known
}

var _ holdfast.Grant = (*Grant)(nil)

// Key implements holdfast.Grant.
func (g *Grant) Key() string { return g.base.Key() }

// Token implements holdfast.Grant.
func (g *Grant) Token() holdfast.Token { return g.base.Token() }

// Context implements holdfast.Grant.
func (g *Grant) Context() context.Context { return g.base.Context() }

// Deadline implements holdfast.Grant.
func (g *Grant) Deadline() time.Time { return g.base.Deadline() }

// Unlock implements holdfast.Grant.
func (g *Grant) Unlock(ctx context.Context) error { return g.base.Unlock(ctx) }

// Session returns the ID of the Consul session that holds the grant.
func (g *Grant) Session() string { return g.s.id }

// Guard returns the operations that succeed exactly while this grant is held:
// a check-session of the lock key on our session, and a check-index on the
// token. Put them first in your own /v1/txn transactions; Txn does it for
// you.
func (g *Grant) Guard() api.TxnOps {
	return api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: g.Key(), Session: g.s.id}},
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: g.Key(), Index: g.token}},
	}
}

// Txn runs ops in one Consul transaction (/v1/txn) that applies only while
// the grant is held, checked by Consul in the same transaction (see Guard).
//
// If the grant was released or lost, locally or in Consul, nothing is
// applied and the error wraps holdfast.ErrNotHeld. If one of ops fails
// (a cas on a stale index, say), nothing is applied either: the error
// describes the failures, and the response is returned too, with the
// indexes in its Errors counted in ops. On success the response's Results
// are those of ops (the guard's are removed). An ACL refusal is an error
// wrapping holdfast.ErrPermissionDenied. If the request itself fails (a
// network error, or ctx or the 10 s client-side timeout ends first), the
// transaction may or may not have been applied, as with any Consul write.
//
// ops must not write the lock key: that would void the guard, and the grant
// with it.
func (g *Grant) Txn(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	guard := g.Guard()
	if len(ops) == 0 || len(ops)+len(guard) > MaxTxnOps {
		return nil, fmt.Errorf("%w: %d operations; a guarded transaction takes 1 to %d", holdfast.ErrInvalidArgument, len(ops), MaxTxnOps-len(guard))
	}
	for i, op := range ops {
		if op == nil {
			return nil, fmt.Errorf("%w: operation %d is nil", holdfast.ErrInvalidArgument, i)
		}
	}
	if !g.base.Held() {
		return nil, g.notHeld()
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
		g.base.Lose(fmt.Errorf("%w: %s is no longer held by session %s with index %d", holdfast.ErrLost, g.Key(), g.s.id, g.token))
		return nil, g.notHeld()
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

// notHeld is the error of an operation on a grant that is not held.
func (g *Grant) notHeld() error {
	if err := g.Context().Err(); err != nil {
		return fmt.Errorf("%w: %s: %w", holdfast.ErrNotHeld, g.Key(), context.Cause(g.Context()))
	}
	return fmt.Errorf("%w: %s", holdfast.ErrNotHeld, g.Key())
}

// release is behind Unlock: a direct handoff to the next waiter if one is
// known (see Session.handOver), else the guarded delete (check-session +
// delete-cas on the token, in one transaction).
func (g *Grant) release(ctx context.Context) error {
	if errors.Is(g.s.alive(), holdfast.ErrSessionClosed) {
		// Close released the key already, if it could.
		return g.notHeld()
	}
	lost := !errors.Is(context.Cause(g.Context()), holdfast.ErrReleased)
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var err error
	if lost {
		err = g.s.release(ctx, g.Key(), g.token)
	} else {
		err = g.s.handOver(ctx, g.Key(), g.token, g.next)
	}
	if err != nil && lost && !errors.Is(err, holdfast.ErrNotHeld) {
		// The grant is gone anyway; Consul frees the key with the session.
		return fmt.Errorf("%w: %s (and releasing it failed: %w)", holdfast.ErrNotHeld, g.Key(), err)
	}
	return err
}

// txn sends ops to /v1/txn as one transaction. When Consul rolls it back
// (HTTP 409), the error is a *rollback and the response holds its Errors.
func (s *Session) txn(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	var resp api.TxnResponse
	_, err := s.client.Raw().Write("/v1/txn", ops, &resp, writeOpts(ctx))
	if err == nil {
		return &resp, nil
	}
	var se api.StatusError
	if errors.As(err, &se) && se.Code == http.StatusConflict {
		var rb api.TxnResponse
		if json.Unmarshal([]byte(se.Body), &rb) == nil && len(rb.Errors) > 0 {
			return &rb, &rollback{errs: rb.Errors}
		}
	}
	return nil, apiError("transaction", err)
}

// kvOp is a KV operation of a transaction.
func kvOp(verb api.KVOp, key string) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: verb, Key: key}}
}
