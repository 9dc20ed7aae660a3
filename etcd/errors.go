package etcd

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/holdfast/holdfast"
)

// storeErr turns an error from the etcd client into a holdfast error: every
// store error that has a holdfast meaning wraps its sentinel, and the
// original error stays in the chain. Context errors are returned unchanged,
// so errors.Is(err, context.Canceled) keeps working.
//
//   - permission denied, failed or invalid authentication: ErrPermissionDenied
//     (the user lacks access to the lock's prefix, or to leases);
//   - lease not found: ErrSessionLost (the session's lease expired or was
//     revoked);
//   - anything else (transport errors, no leader, timeouts) is returned as is:
//     it may succeed when retried.
func storeErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, rpctypes.ErrPermissionDenied),
		errors.Is(err, rpctypes.ErrAuthFailed),
		errors.Is(err, rpctypes.ErrInvalidAuthToken),
		errors.Is(err, rpctypes.ErrUserEmpty):
		return fmt.Errorf("%w: %w", holdfast.ErrPermissionDenied, err)
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%w: %w", holdfast.ErrSessionLost, err)
	}
	return err
}
