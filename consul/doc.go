// Package consul is the Consul backend of holdfast: fair, fenced locks over
// Consul sessions and the KV store, built on github.com/hashicorp/consul/api.
//
// # Sessions
//
// A [Session] is one Consul session, renewed in the background every TTL/3;
// any number of locks are acquired with it. [Dial] opens one on a client of
// its own; [NewSession] uses yours. By default a session has no node health
// checks, so Consul invalidates it only by TTL, and every grant's context is
// cancelled at a safe local deadline, before Consul could invalidate the
// session and let another client in (see [WithMargin] for the assumptions,
// and [WithNodeChecks] for the trade-off of health checks). The lock-delay
// is configurable down to 0 ([WithLockDelay]).
//
// How fast a loss is noticed: a destroyed or invalidated session within
// milliseconds (a blocking query on the session); a lock key deleted or
// taken over from outside within TTL/3 (5 s at the default TTL: the session
// checks its held keys after every renewal, in one read per 64 keys), or at
// once when a guarded write or Unlock of the session finds a key gone. A
// held lock costs no goroutine and about 1.4 KiB.
//
// # Locks
//
// A [Mutex] on name holds the key "<name>/.lock" ([LockKey]) with the session
// and api.Lock's flags, exactly as api.Lock with LockOptions{Key: name +
// "/.lock"} and `consul lock name cmd` do, so holdfast and those clients
// exclude each other on one lock. holdfast contenders queue in FIFO order
// under "<name>/.queue/<session ID>"; only the head of the queue tries to
// acquire, and each waiter watches only the one ahead of it. On Unlock, a
// holder hands the lock directly to the current head of the queue, in one
// transaction (a waiter that queued after the holder acquired the lock
// announces itself with a write to the lock key that keeps its holder, so
// Unlock reads the queue only then), so foreign api.Lock or `consul lock`
// clients get the lock only when no holdfast waiter queues (Consul still
// enforces exclusion). Lock, TryLock, Unlock and [Grant.Txn] return within
// milliseconds of their context ending, even with Consul unreachable; what
// must still be removed from Consul is removed by the session in the
// background, as soon as Consul can be reached, while the session lives.
//
// A [Grant] is held while our session holds the lock key. Its fencing token
// is the ModifyIndex of the write that acquired the key (not its LockIndex,
// which a plain write resets), and [Grant.Txn] runs KV operations in a
// transaction that applies only while the grant is held (a check-session on
// the lock key); it refuses operations on the lock's own keys.
//
// Names nest as on etcd: a lock on "a" fails with holdfast.ErrConflict if
// keys of a longer name (such as "a/b/.lock") lie under "a/".
//
// To share a lock with a shell script, run `consul lock <name> cmd` (one
// holder at a time, the default): it uses the same key and flags. A key used
// by `consul lock -n N` (a semaphore) is refused with holdfast.ErrConflict.
//
// # Semaphores and read-write locks
//
// A [Semaphore] on name with limit N lets at most N sessions hold a permit
// at once. It uses api.Semaphore's layout with prefix name: contender keys
// "<name>/<session ID>" acquired with their session, and "<name>/.lock"
// holding {"Limit":N,"Holders":{...}}, flagged api.SemaphoreFlagValue; so
// api.Semaphore and `consul lock -n N <name> cmd` share its permits.
// holdfast contenders queue by their keys' CreateIndex: a releasing holder
// hands its permit to the head of the queue in the same CAS of the lock key
// that removes it, and marks the new holder's key, which that waiter
// watches; only the head (and only when a foreign contender is about, or it
// joined a full semaphore) watches the lock key. Measured with limit 4 and
// no hold time (docs/BENCHMARKS.md, the full run): 5.2 HTTP requests per
// acquisition at 8 contenders and 5.4 at 32, blocking queries included
// (api.Semaphore: 23 and 53), and 2.4 and 5.7 times api.Semaphore's
// acquisitions per second; TestSemaphoreVersusAPI fails above 8. A client
// with another limit gets holdfast.ErrConflict naming both.
//
// An [RWMutex] (readers share, a writer excludes everyone, FIFO, and
// [RWMutex.Downgrade] from write to read without a gap) has no native Consul
// layout: it is the Semaphore's, with its own flags ([RWMutexFlagValue]) and
// lock value {"Holders":{"<session ID>":"read"|"write"}}. A Mutex, api.Lock,
// a Semaphore or api.Semaphore on its name fails, and the other way round.
//
// Permits and read or write locks are Grants too: their key is the
// holder's contender key, their guard (for [Grant.Txn]) a check-session on
// it, their token the ModifyIndex of the lock-key write that admitted them.
// A holder whose session ends stops being counted (the next write prunes
// holders whose session holds no key under the name; a waiting head re-reads
// every 5 s for that); its context is cancelled first, at the session's safe
// deadline, when the session ends by its TTL.
//
// # Elections
//
// An [Election] on name is Consul's documented leader-election pattern: the
// leader is the session that holds "<name>/.lock" (api.Lock's flags), and
// the key's value is the leader's proposal, so api.Lock and `consul lock`
// exclude holdfast candidates and anyone who reads the key sees the leader.
// Candidates wait in the Mutex's FIFO queue; the head takes the key when it
// is free, right when the previous holder's lock-delay ends (to the
// millisecond, not on api.Lock's 5 s retry). Campaign returns the
// leadership as a *Grant (term = the ModifyIndex of the acquiring write,
// which creates the key anew so that the term stays readable as its
// CreateIndex); Resign deletes the key, guarded; Proclaim rewrites the value
// while our session holds the key; Leader and Observe (blocking queries on
// the key: it may coalesce rapid changes) report the leader, its value and
// term, or "no leader" when the key is free or absent. leader.Run drives an
// Election in a loop.
//
// Errors wrap the sentinels of package holdfast: ErrInvalidArgument
// (returned before any request), ErrLocked, ErrNotHeld, ErrLost, ErrNoLeader,
// ErrSessionLost, ErrSessionClosed, ErrConflict and ErrPermissionDenied (an
// ACL refused a request).
//
// # Secured agents
//
// [Dial] reads the token and TLS settings of the environment as Consul's
// own tools do ($CONSUL_HTTP_TOKEN, $CONSUL_HTTP_TOKEN_FILE,
// $CONSUL_CACERT, $CONSUL_CLIENT_CERT, $CONSUL_CLIENT_KEY, $CONSUL_HTTP_SSL,
// an "https://" address), or takes them explicitly: [WithToken], [WithTLS]
// or [WithTLSFiles] (Dial only; [NewSession] refuses them: configure your
// client). With ACLs enabled, the token's policy needs session write (for
// example session_prefix "" { policy = "write" }) and key write on the locks'
// prefixes; without them, or with no or an unknown token, requests fail
// with errors wrapping holdfast.ErrPermissionDenied and nothing is written.
// An agent whose certificate the CA does not vouch for makes Dial fail at
// once with the TLS error. Tokens and key material never appear in errors.
package consul
