package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/internal/core"
)

// MaxTxnOps is the most operations Consul accepts in one transaction
// (Grant.Txn adds its guard to yours).
const MaxTxnOps = 128

// write sends in to path, with out for the answer, sent again while Consul
// refuses it unapplied (see refused), until ctx ends or requestTimeout
// passes; sent: when the last attempt went.
func write(ctx context.Context, client *api.Client, path string, in, out any) (sent time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_ = core.Backoff{Final: func(err error) bool { return !refused(err) }}.Retry(ctx, func(ctx context.Context) error {
		sent = time.Now()
		_, err = client.Raw().Write(path, in, out, writeOpts(ctx))
		return err
	})
	return sent, err
}

// txn sends ops to /v1/txn as one transaction (see write). When Consul
// rolls it back (HTTP 409), the error is a *rollback and the response holds
// its Errors.
func (s *Session) txn(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	var out api.TxnResponse
	_, err := write(ctx, s.client, "/v1/txn", ops, &out)
	var se api.StatusError
	switch {
	case errors.As(err, &se) && se.Code == http.StatusConflict && json.Unmarshal([]byte(se.Body), &out) == nil && len(out.Errors) > 0:
		return &out, &rollback{errs: out.Errors}
	case err != nil:
		return nil, apiError("transaction", err)
	}
	return &out, nil
}

// The operations of a transaction on key: kvOp's verb, check-session,
// check-index, delete-cas; lockOp acquires it for session with a lock's
// flags, acquireOp with none (a queue entry, or a key under it).
func kvOp(verb api.KVOp, key string) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: verb, Key: key}}
}
func checkSession(key, session string) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: key, Session: session}}
}
func checkIndex(key string, index uint64) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: key, Index: index}}
}
func deleteCAS(key string, index uint64) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: key, Index: index}}
}
func lockOp(key, session string, value []byte) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Flags: api.LockFlagValue, Session: session, Value: value}}
}
func acquireOp(key, session string, value []byte) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Session: session, Value: value}}
}

// rollback is a transaction that Consul rolled back (HTTP 409): nothing of
// it was applied; errs says which operations failed and why.
type rollback struct {
	errs api.TxnErrors
}

func (r *rollback) Error() string {
	msgs := make([]string, 0, len(r.errs))
	for _, e := range r.errs {
		msgs = append(msgs, fmt.Sprintf("op %d: %s", e.OpIndex, e.What))
	}
	return "transaction rolled back: " + strings.Join(msgs, "; ")
}

// anyOp reports whether an operation failed and ok(its index, its message).
func (r *rollback) anyOp(ok func(i int, what string) bool) bool {
	return slices.ContainsFunc(r.errs, func(e *api.TxnError) bool { return ok(e.OpIndex, e.What) })
}

// has reports whether an operation failed with a message containing sub.
func (r *rollback) has(sub string) bool {
	return r.anyOp(func(_ int, what string) bool { return strings.Contains(what, sub) })
}

// An operation failed because: an ACL refused it (denied), a lock-delay
// (lockDelayed), or a lock named a session that no longer exists
// (sessionGone).
func (r *rollback) denied() bool      { return r.has("Permission denied") || r.has("ACL not found") }
func (r *rollback) lockDelayed() bool { return r.has("due to lock delay") }
func (r *rollback) sessionGone() bool { return r.has("invalid session") }

// delayedOnly: only operation i failed, refused because of a lock-delay.
func (r *rollback) delayedOnly(i int) bool {
	return len(r.errs) > 0 && !r.anyOp(func(j int, what string) bool { return j != i || !strings.Contains(what, "due to lock delay") })
}

// failed: operation i failed.
func (r *rollback) failed(i int) bool { return r.anyOp(func(j int, _ string) bool { return j == i }) }

// failedBefore: an operation with index < n failed.
func (r *rollback) failedBefore(n int) bool {
	return r.anyOp(func(j int, _ string) bool { return j < n })
}
