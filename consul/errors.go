package consul

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// errSessionGone means Consul answered that the session does not exist (it
// was destroyed, or invalidated by its TTL or a health check).
var errSessionGone = errors.New("session not found in Consul")

// apiError wraps an error of the Consul HTTP API with what we were doing. An
// ACL refusal (HTTP 403) becomes an error wrapping
// holdfast.ErrPermissionDenied.
func apiError(op string, err error) error {
	var se api.StatusError
	if errors.As(err, &se) && se.Code == http.StatusForbidden {
		return fmt.Errorf("%w: holdfast/consul: %s: %s", holdfast.ErrPermissionDenied, op, se.Body)
	}
	return fmt.Errorf("holdfast/consul: %s: %w", op, err)
}

// statusCode returns the HTTP status of a Consul API error, or 0.
func statusCode(err error) int {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
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

// failedBefore reports whether an operation with index < n failed.
func (r *rollback) failedBefore(n int) bool {
	for _, e := range r.errs {
		if e.OpIndex < n {
			return true
		}
	}
	return false
}

// txnError turns a rolled-back transaction into the error a caller gets.
func txnError(op string, r *rollback) error {
	if r.denied() {
		return fmt.Errorf("%w: holdfast/consul: %s: %v", holdfast.ErrPermissionDenied, op, r)
	}
	return fmt.Errorf("holdfast/consul: %s: %w", op, r)
}
