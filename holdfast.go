package holdfast

import (
	"context"
	"strconv"
)

// Token is a fencing token. Tokens of successive grants of one lock strictly
// increase, so a resource that remembers the highest token it has accepted can
// refuse a write from a holder whose grant has since passed to someone else.
//
// On etcd the token is the create revision of the holder's key; on Consul it is
// the raft index (ModifyIndex) of the write that acquired the lock key. Both
// are store-wide counters: tokens are comparable between grants of the same
// lock, and they are never zero.
type Token uint64

// String returns the token in decimal.
func (t Token) String() string { return strconv.FormatUint(uint64(t), 10) }

// Grant is a held lock (or one slot of a semaphore, or leadership).
//
// A Grant is safe for concurrent use.
type Grant interface {
	// Key is the store key whose existence (etcd) or acquisition (Consul)
	// holds the grant.
	Key() string

	// Token is the fencing token of this grant. It does not change while the
	// grant is held, including across reentrant acquisitions.
	Token() Token

	// Context is cancelled when the grant ends. After Unlock its cause
	// (context.Cause) is ErrReleased. When the grant is lost, its cause wraps
	// ErrLost, and ErrSessionLost or ErrSessionClosed where that is why; the
	// backends cancel it before the store could grant the lock to another
	// client, under the assumptions documented on their session options.
	// Work protected by the grant should run under this context.
	Context() context.Context

	// Unlock releases the grant. It removes only this grant's key (a late or
	// repeated Unlock never touches a newer grant) and returns ErrNotHeld if
	// the grant was already released or lost. A reentrant grant is released
	// by the Unlock that matches its first Lock.
	Unlock(ctx context.Context) error
}

// Locker hands out grants of one named lock.
type Locker interface {
	// Lock blocks until the lock is granted, ctx is done, or the session
	// behind the locker ends. Waiters are granted in first-come order. On
	// any error nothing is left in the store.
	Lock(ctx context.Context) (Grant, error)

	// TryLock takes the lock if nobody holds it or waits for it, and returns
	// an error wrapping ErrLocked at once otherwise.
	TryLock(ctx context.Context) (Grant, error)
}
