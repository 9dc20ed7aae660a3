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

// Grant is a held Consul lock, permit or leadership, a holdfast.Grant. It
// lasts while our session holds its key (the lock key "<name>/.lock", or a
// permit's contender key "<name>/<session ID>"); the session's end, or the
// key deleted or taken over from outside, ends it. Its token is the
// ModifyIndex of the write that granted it.
type Grant struct {
	base   *core.Grant // key, token, context, reentrancy; ends it through ending
	s      *Session
	prefix string   // "<name>/": the primitive's own keys, which Txn refuses
	rel    releaser // how the grant's algorithm ends it in Consul
}

// releaser ends a grant in Consul: acquisition (release.go: a Mutex's or an
// Election's) or pacq (permitwait.go: a Semaphore's or RWMutex's).
type releaser interface {
	release(ctx context.Context, g *Grant) error // after Unlock or a loss
	drop(ctx context.Context, g *Grant) error    // as the session closes: no handoff
}

// ending is a Grant as internal/core ends it.
type ending Grant

// Release implements core.Releaser: g.rel's; once done or impossible, the
// session forgets the grant.
func (e *ending) Release(ctx context.Context) error {
	g := (*Grant)(e)
	err := g.rel.release(ctx, g)
	if err == nil || core.Final(err) {
		g.s.forget(g)
	}
	return err
}

var _ holdfast.Grant = (*Grant)(nil)

// grant returns the Grant of key, under prefix, that rel ends and that
// calls free once ended, held by s; if s ended meanwhile, its end (Close
// releases the key).
func (s *Session) grant(key, prefix string, token uint64, rel releaser, free func()) (*Grant, error) {
	g := &Grant{s: s, prefix: prefix, rel: rel}
	g.base = core.NewGrant(s.keeper, s.bg, key, holdfast.Token(token), (*ending)(g), free)
	s.hold(g)
	if g.Context().Err() != nil {
		return nil, s.alive()
	}
	return g, nil
}

// Key implements holdfast.Grant.
func (g *Grant) Key() string { return g.base.Key() }

// Token implements holdfast.Grant.
func (g *Grant) Token() holdfast.Token { return g.base.Token() }

// Context implements holdfast.Grant.
func (g *Grant) Context() context.Context { return g.base.Context() }

// Deadline implements holdfast.Grant.
func (g *Grant) Deadline() time.Time { return g.base.Deadline() }

// Unlock implements holdfast.Grant: it hands the lock to the next holdfast
// waiter, or deletes the key, in one write guarded by our session holding
// the key (usually one request).
func (g *Grant) Unlock(ctx context.Context) error { return g.base.Unlock(ctx) }

// Guard returns the operation that succeeds exactly while the grant is
// held (a check-session of its key), to put first in your own transactions.
func (g *Grant) Guard() api.TxnOps {
	return api.TxnOps{checkSession(g.Key(), g.s.id)}
}

// Txn runs ops in one transaction that applies only while the grant is held
// (Guard first); if it is not, the error wraps holdfast.ErrNotHeld (and the
// grant ends). No ops, more than MaxTxnOps-1, a nil op, or one under
// "<name>/" are refused with holdfast.ErrInvalidArgument. If one of ops
// fails, nothing is applied and the response comes with the error, its
// Errors indexed in ops; on success its Results are those of ops.
func (g *Grant) Txn(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	return g.s.heldTxn(ctx, g.base, g.prefix, txnGuard(g.Key(), g.s.id), ops, "session "+g.s.id)
}

// heldTxn is Txn for base, a grant or claim whose own keys lie under
// prefix, held by whose session, which guard checks.
func (s *Session) heldTxn(ctx context.Context, base *core.Grant, prefix string, guard, ops api.TxnOps, whose string) (*api.TxnResponse, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if err := (&Grant{prefix: prefix}).checkOps(ops); err != nil {
		return nil, err
	}
	if !base.Held() {
		return nil, base.NotHeld()
	}
	return s.guardedTxn(ctx, base, base.Key(), whose, guard, ops)
}

// lossy is what a failed guard ends: a core.Grant or core.Multi.
type lossy interface {
	Lose(cause error)
	NotHeld() error
}

// guardedTxn sends guard, then ops, in one transaction (see Txn) on what,
// held by whose; if guard fails (and no ACL refused it), g is lost and the
// error is its NotHeld.
func (s *Session) guardedTxn(ctx context.Context, g lossy, what, whose string, guard, ops api.TxnOps) (*api.TxnResponse, error) {
	resp, err := s.txn(ctx, append(guard, ops...))
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.failedBefore(len(guard)) && !rb.denied():
		g.Lose(fmt.Errorf("%w: %s is no longer held by %s (a guarded transaction failed its check)", holdfast.ErrLost, what, whose))
		s.checkSoon()
		return nil, g.NotHeld()
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

// lose ends the grant after checkKeys found its key e not held by us.
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

// releaseKey deletes key if our session holds it (else an error wrapping
// holdfast.ErrNotHeld): a key held outside any live grant.
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
