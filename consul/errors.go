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

// refused reports whether Consul answered that it did not apply a request:
// HTTP 429 (rate limited), or a 500 while it has no leader or before the
// agent's node is registered (for a moment after it starts). Sending the
// request again is then safe.
func refused(err error) bool {
	var se api.StatusError
	if !errors.As(err, &se) {
		return false
	}
	return se.Code == http.StatusTooManyRequests ||
		se.Code >= 500 && (strings.Contains(se.Body, "No cluster leader") || strings.Contains(se.Body, "Missing node registration"))
}

// txnError turns a rolled-back transaction into the error a caller gets: one
// wrapping holdfast.ErrPermissionDenied if an ACL refused an operation.
func txnError(op string, r *rollback) error {
	if r.denied() {
		return fmt.Errorf("%w: holdfast/consul: %s: %v", holdfast.ErrPermissionDenied, op, r)
	}
	return fmt.Errorf("holdfast/consul: %s: %w", op, r)
}

// sessionLost is the cause of a session that Consul says no longer exists.
func sessionLost(id, what string) error {
	return fmt.Errorf("%w: consul session %s %s", holdfast.ErrSessionLost, id, what)
}
