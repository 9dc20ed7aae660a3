package holdfast

import "errors"

// Errors returned by every backend. Match them with errors.Is: backends wrap
// them with detail.
var (
	// ErrInvalidArgument is wrapped by every error about bad input (a name,
	// a TTL, a nil client, an option out of range). Such errors are returned
	// before any request reaches the store.
	ErrInvalidArgument = errors.New("holdfast: invalid argument")

	// ErrInvalidName means a lock name is empty or malformed. It wraps
	// ErrInvalidArgument.
	ErrInvalidName = wrap(ErrInvalidArgument, "invalid name")

	// ErrInvalidTTL means a session TTL (or its safety margin) is out of the
	// range the store accepts. It wraps ErrInvalidArgument.
	ErrInvalidTTL = wrap(ErrInvalidArgument, "invalid TTL")

	// ErrLocked is returned by TryLock when the lock is held or waited for by
	// someone else.
	ErrLocked = errors.New("holdfast: locked by another holder")

	// ErrNotHeld is returned by Unlock and by guarded writes when the grant is
	// no longer held: it was released, or it was lost.
	ErrNotHeld = errors.New("holdfast: grant not held")

	// ErrLost is the cause of a grant's context when the grant was lost
	// rather than released.
	ErrLost = errors.New("holdfast: grant lost")

	// ErrSessionLost means the session (etcd lease, Consul session) behind a
	// grant or a waiter expired, was revoked, or could not be renewed in
	// time. It wraps ErrLost.
	ErrSessionLost = wrap(ErrLost, "session lost")

	// ErrSessionClosed is returned when a closed session is used, and is the
	// cause of grants that ended because their session was closed.
	ErrSessionClosed = errors.New("holdfast: session closed")

	// ErrReleased is the cause of a grant's context after Unlock.
	ErrReleased = errors.New("holdfast: grant released")

	// ErrConflict means the key is in use by a different kind of primitive
	// (for example a Consul semaphore where a lock was asked for), or by a
	// client whose layout holdfast cannot share.
	ErrConflict = errors.New("holdfast: key used by a different primitive")

	// ErrLimitMismatch means a semaphore was asked for with a limit other
	// than the one its current holders and waiters use. It wraps
	// ErrConflict.
	ErrLimitMismatch error = &named{ErrConflict, "holdfast: semaphore limit mismatch"}

	// ErrPermissionDenied means the store refused the request for lack of
	// permission (an ACL).
	ErrPermissionDenied = errors.New("holdfast: permission denied")

	// ErrNoLeader means an election has no leader at the moment: nobody
	// campaigns, or the last leader resigned or was lost and no candidate
	// has won yet.
	ErrNoLeader = errors.New("holdfast: no leader")
)

type wrapped struct {
	parent error
	msg    string
}

func wrap(parent error, msg string) error { return &wrapped{parent, msg} }

func (w *wrapped) Error() string { return w.parent.Error() + ": " + w.msg }
func (w *wrapped) Unwrap() error { return w.parent }

// named is an error with its own message that matches its parent too.
type named struct {
	parent error
	msg    string
}

func (n *named) Error() string { return n.msg }
func (n *named) Unwrap() error { return n.parent }
