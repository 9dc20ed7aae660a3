// Package consul is the Consul backend of holdfast: fair, fenced locks over
// Consul sessions and the KV store, built on github.com/hashicorp/consul/api.
//
// # Sessions
//
// A [Session] is one Consul session, renewed in the background every TTL/3;
// any number of locks are acquired with it. By default it has no node health
// checks, so Consul invalidates it only by TTL, and every grant's context is
// cancelled at a safe local deadline, before Consul could invalidate the
// session and let another client in (see [WithMargin] for the assumptions,
// and [WithNodeChecks] for the trade-off of health checks). A destroyed or
// invalidated session is noticed at once through a blocking query. The
// lock-delay is configurable down to 0 ([WithLockDelay]).
//
// # Locks
//
// A [Mutex] on name holds the key "<name>/.lock" ([LockKey]) with the session
// and api.Lock's flags, exactly as api.Lock with LockOptions{Key: name +
// "/.lock"} and `consul lock name cmd` do, so holdfast and those clients
// exclude each other on one lock. holdfast contenders queue in FIFO order
// under "<name>/.queue/<session ID>"; only the head of the queue tries to
// acquire, and each waiter watches only the one ahead of it. On Unlock, a
// holder hands the lock directly to the head of the queue, in one
// transaction; so foreign api.Lock or `consul lock` clients get the lock only
// when no holdfast waiter queues (Consul still enforces exclusion). The fencing
// token of a [Grant] is the ModifyIndex of the write that acquired the key
// (not its LockIndex, which a plain write resets), and [Grant.Txn] runs KV
// operations in a transaction that applies only while the grant is held.
//
// To share a lock with a shell script, run `consul lock <name> cmd` (one
// holder at a time, the default): it uses the same key and flags. A key used
// by `consul lock -n N` (a semaphore) is refused with holdfast.ErrConflict.
//
// Errors wrap the sentinels of package holdfast: ErrInvalidArgument
// (returned before any request), ErrLocked, ErrNotHeld, ErrSessionLost,
// ErrSessionClosed, ErrConflict and ErrPermissionDenied (an ACL refused a
// request).
package consul
