package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/internal/core"
)

// MaxTxnOps is the most operations Consul accepts in one transaction.
// Grant.Txn adds its guard to yours, so it takes up to MaxTxnOps - 1.
const MaxTxnOps = 128

// txn sends ops to /v1/txn as one transaction. When Consul rolls it back
// (HTTP 409), the error is a *rollback and the response holds its Errors.
// A transaction that Consul refused without applying it (see refused) is
// sent again, with the backends' backoff, until ctx ends.
func (s *Session) txn(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	var resp *api.TxnResponse
	var err error
	_ = core.Backoff{Final: func(err error) bool { return !refused(err) }}.Retry(ctx, func(ctx context.Context) error {
		resp, err = s.txnOnce(ctx, ops)
		return err
	})
	return resp, err
}

// txnOnce sends ops once (see txn).
func (s *Session) txnOnce(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
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

// kvOp is a KV operation of a transaction on key.
func kvOp(verb api.KVOp, key string) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: verb, Key: key}}
}

// checkSession is the operation that fails unless session holds key.
func checkSession(key, session string) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: key, Session: session}}
}

// checkIndex is the operation that fails unless key's ModifyIndex is index.
func checkIndex(key string, index uint64) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: key, Index: index}}
}

// deleteCAS is the operation that deletes key if its ModifyIndex is index.
func deleteCAS(key string, index uint64) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: key, Index: index}}
}

// lockOp is the operation that acquires key for session with a lock's flags
// and value.
func lockOp(key, session string, value []byte) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Flags: api.LockFlagValue, Session: session, Value: value}}
}

// acquireOp is a lock operation with no flags: a queue entry's, or a key
// under it.
func acquireOp(key, session string, value []byte) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Session: session, Value: value}}
}

// rollback is a /v1/txn transaction that Consul rolled back (HTTP 409):
// nothing of it was applied. errs says which operations failed and why.
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

// has reports whether an operation failed with a message containing one of
// subs.
func (r *rollback) has(subs ...string) bool {
	for _, e := range r.errs {
		for _, s := range subs {
			if strings.Contains(e.What, s) {
				return true
			}
		}
	}
	return false
}

// denied reports whether an operation was refused by an ACL.
func (r *rollback) denied() bool { return r.has("Permission denied", "ACL not found") }

// lockDelayed reports whether a lock operation was refused because of a
// lock-delay (the key's previous holder's session was invalidated).
func (r *rollback) lockDelayed() bool { return r.has("due to lock delay") }

// sessionGone reports whether a lock operation named a session that no
// longer exists.
func (r *rollback) sessionGone() bool { return r.has("invalid session") }

// delayedOnly reports whether the only operation that failed is operation
// i, refused because of a lock-delay.
func (r *rollback) delayedOnly(i int) bool {
	for _, e := range r.errs {
		if e.OpIndex != i || !strings.Contains(e.What, "due to lock delay") {
			return false
		}
	}
	return len(r.errs) > 0
}

// failed reports whether operation i failed.
func (r *rollback) failed(i int) bool {
	for _, e := range r.errs {
		if e.OpIndex == i {
			return true
		}
	}
	return false
}

// failedBefore reports whether an operation with index < n failed.
func (r *rollback) failedBefore(n int) bool {
	for _, e := range r.errs {
		if e.OpIndex < n {
			return true
		}
	}
	return false
}
