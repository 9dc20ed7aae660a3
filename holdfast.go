package holdfast

import (
	"context"
	"strconv"
	"time"
)

// Token is a fencing token. Tokens of successive grants of one lock strictly
// increase, so a resource that remembers the highest token it has accepted can
// refuse a write from a holder whose grant has since passed to someone else.
//
// On etcd the token is the create revision of the holder's key; on Consul it is
// the raft index (ModifyIndex) of the write that acquired the lock key. Both
// are store-wide counters: tokens are comparable between grants of the same
// lock, and they are never zero. They are not consecutive: other writes to the
// store advance the same counter, so gaps between tokens are normal.
type Token uint64

// String returns the token in decimal.
func (t Token) String() string { return strconv.FormatUint(uint64(t), 10) }

// Grant is a held lock (or one slot of a semaphore, or leadership).
//
// A Grant is safe for concurrent use.
type Grant interface {
	// Key is the store key that holds the grant: on etcd the holder's own
	// key "<name>/<lease ID in hex>", whose existence is the grant; on
	// Consul the lock key "<name>/.lock", acquired with the holder's
	// session.
	Key() string

	// Token is the fencing token of this grant. It does not change while the
	// grant is held, including across reentrant acquisitions.
	Token() Token

	// Context is cancelled when the grant ends. After Unlock its cause
	// (context.Cause) is ErrReleased. When the grant is lost, its cause wraps
	// ErrLost, and ErrSessionLost or ErrSessionClosed where that is why; the
	// backends cancel it before the store could grant the lock to another
	// client, under the assumptions documented on their session options.
	// Its Err and Done methods compare the safe deadline (see Deadline) with
	// the monotonic clock on every call, so a holder that was paused past
	// the deadline sees the grant as lost at its first check after the
	// pause, before any timer has fired. Work protected by the grant should
	// run under this context.
	Context() context.Context

	// Deadline is the grant's safe deadline as of this call: the moment on
	// this process's monotonic clock after which the store may have
	// expired the session behind the grant, minus the safety margin. Each
	// acknowledged renewal moves it forward. Use it to bound work passed
	// downstream (a database statement timeout, say). A context's own
	// deadline cannot move, which is why Context does not report it.
	Deadline() time.Time

	// Unlock releases the grant. It removes only this grant's key (a late or
	// repeated Unlock never touches a newer grant) and returns an error
	// wrapping ErrNotHeld if the grant was already released or lost; a
	// reentrant grant is released by the Unlock that matches its first
	// Lock.
	//
	// The grant ends locally at once: its context is cancelled with
	// ErrReleased before the release is sent. ctx bounds only the wait for
	// the store to confirm the release: if ctx ends first (or the store
	// cannot be reached), Unlock returns an error wrapping ctx's error, and
	// the session goes on releasing the key in the background, retrying
	// while the session lives; the lock can be taken again through the
	// same session once that is done. Unlock of a grant already known to
	// be lost returns at once, without waiting for the store.
	Unlock(ctx context.Context) error
}

// Locker hands out grants of one named lock.
type Locker interface {
	// Lock blocks until the lock is granted, ctx is done, or the session
	// behind the locker ends. Waiters are granted in first-come order. It
	// returns within milliseconds of ctx ending, even if the store cannot be
	// reached; whatever the attempt left in the store (a waiter's key) is
	// removed in the background by the session, as soon as the store can be
	// reached, while the session lives.
	Lock(ctx context.Context) (Grant, error)

	// TryLock takes the lock if nobody holds it or waits for it, and returns
	// an error wrapping ErrLocked at once otherwise. It writes nothing when
	// it fails.
	TryLock(ctx context.Context) (Grant, error)
}

// GrantLocker is what every backend's lock offers: Lock and TryLock that
// return the backend's own grant type G (such as *etcd.Grant), so that
// guarded writes need no type assertion. AsLocker turns one into a Locker.
type GrantLocker[G Grant] interface {
	Lock(ctx context.Context) (G, error)
	TryLock(ctx context.Context) (G, error)
}

// AsLocker returns l as a Locker, for code that should not depend on the
// store:
//
//	m, err := etcd.NewMutex(s, "jobs/nightly")
//	...
//	var l holdfast.Locker = holdfast.AsLocker(m)
//
// Lock and TryLock return l's grants unchanged (a type switch on the Grant
// recovers the backend's type); on error the Grant is nil.
func AsLocker[G Grant](l GrantLocker[G]) Locker { return locker[G]{l} }

type locker[G Grant] struct{ l GrantLocker[G] }

func (a locker[G]) Lock(ctx context.Context) (Grant, error)    { return grant(a.l.Lock(ctx)) }
func (a locker[G]) TryLock(ctx context.Context) (Grant, error) { return grant(a.l.TryLock(ctx)) }

// grant converts a backend's (G, error) into (Grant, error) without turning a
// nil *T into a non-nil interface.
func grant[G Grant](g G, err error) (Grant, error) {
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Leader is what an election publishes about its leader: the leader's key
// in the store, the value it campaigned with (or proclaimed since), and its
// term, the fencing token of its leadership grant. Terms of successive
// leaders of one election strictly increase.
//
// The zero Leader (Key == "") means "no leader"; an election's Observe
// delivers it when the last leader is gone and nobody has won yet.
type Leader struct {
	// Key is the leader's key (its Grant's Key); "" when there is no leader.
	Key string
	// Value is the leader's published value.
	Value []byte
	// Term is the fencing token of the leader's grant.
	Term Token
}

// None reports whether l means "no leader".
func (l Leader) None() bool { return l.Key == "" }
