package consul

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// errSessionGone: Consul answered that the session does not exist.
var errSessionGone = errors.New("session not found in Consul")

// apiError wraps an error of the Consul HTTP API with what we were doing;
// an ACL refusal (HTTP 403) wraps holdfast.ErrPermissionDenied.
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

// refused reports whether Consul answered that it did not apply a request,
// so that sending it again is safe: HTTP 429, or a 500 without a leader or
// before the agent's node is registered.
func refused(err error) bool {
	var se api.StatusError
	return errors.As(err, &se) && (se.Code == http.StatusTooManyRequests ||
		se.Code >= 500 && (strings.Contains(se.Body, "No cluster leader") || strings.Contains(se.Body, "Missing node registration")))
}

// answerLost reports whether a write may have applied without its answer
// reaching us: no answer, or the agent's error while the servers may have
// applied it.
func answerLost(err error) bool {
	c := statusCode(err)
	return err != nil && (c == 0 || c >= 500 && !refused(err))
}

// txnError is the error of a rolled-back transaction: wrapping
// holdfast.ErrPermissionDenied if an ACL refused an operation.
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
