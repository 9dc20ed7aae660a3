// Package etcd implements holdfast's locks on etcd leases and
// revision-ordered keys. Take a lock, write under it, release it, with
// endpoints your cluster's client URLs (as in clientv3.Config):
//
//	s, err := etcd.Dial(ctx, endpoints) // one lease, kept alive, for every lock of the process
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer s.Close()
//	m, err := etcd.NewMutex(s, "jobs/nightly-report")
//	if err != nil {
//		log.Fatal(err)
//	}
//	g, err := m.Lock(ctx) // waits its turn; g.Context() ends if the lock is lost
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer func() {
//		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
//		defer cancel()
//		_ = g.Unlock(uctx) // if etcd does not answer in time, the session releases it later
//	}()
//	// g.Token() fences writes elsewhere; g.Txn commits only while the lock is held.
//	record := fmt.Sprintf("done under token %d", g.Token())
//	if _, err := g.Txn(g.Context(), clientv3.OpPut("reports/last", record)); err != nil {
//		log.Fatal(err)
//	}
//
// These lines are the body of ExampleMutex_Lock, run against a real etcd by
// the tests module (tests/etcd).
//
// A Session is one lease, kept alive in the background and shared by every
// grant taken through it; Dial opens one on a client of its own, NewSession
// on a client you configured. A Mutex is a FIFO lock with the key layout of
// go.etcd.io/etcd/client/v3/concurrency.Mutex (keys "<name>/<lease ID in
// hex>", the holder being the key with the lowest create revision), so
// `etcdctl lock <name>` and concurrency.NewMutex(session, name) exclude
// holdfast on the same name, and the other way round.
//
// A Semaphore admits at most N holders of a name at once, with the same
// layout (each contender's key carries the limit, so clients that disagree
// on it get holdfast.ErrConflict instead of over-admission). A RWMutex is a
// FIFO read-write lock with the layout of etcd's recipe.RWMutex ("<name>/read/..."
// and "<name>/write/..."), which it excludes and is excluded by; a write
// grant can be downgraded to a read grant in place. Their permits and
// grants are the same *Grant as a Mutex's (token, guarded Txn, loss
// notice). Their waiters are woken by one watch of the name's prefix,
// opened before they join, so an acquisition costs two requests whatever
// the number of contenders. A Mutex, a Semaphore and a RWMutex may not
// share a name: whoever comes second gets holdfast.ErrConflict.
//
// An [Election] has the key layout of concurrency.Election (candidates'
// keys "<name>/<lease ID in hex>" with the proposal as value, the leader
// being the lowest create revision), so `etcdctl elect <name>` and
// concurrency.NewElection(session, name) campaign in the same queue and see
// the same leader. Campaign waits with the Mutex's algorithm (re-checking
// its own key, cleaning up on every error) and returns the leadership as a
// *Grant whose token is the term; Resign, a guarded Proclaim, Leader (an
// error wrapping holdfast.ErrNoLeader when there is none) and Observe, which
// delivers every leader in order, "no leader" included. leader.Run drives
// an Election in a loop.
//
// What holdfast adds over the concurrency recipe:
//
//   - a fencing token on every grant: the create revision of the holder's key;
//   - guarded writes (Grant.Txn) that commit only while the grant holds;
//   - a grant context cancelled before the lease can expire on the server
//     (WithMargin documents the assumption);
//   - a guarded Unlock that can never delete a newer grant's key;
//   - Lock, TryLock and Unlock that return within milliseconds of their
//     context's end, even with etcd unreachable, leaving the cleanup (a
//     waiter's key, a release) to the session, retried while it lives;
//   - waiters that notice their session's loss promptly and re-check their
//     own key before taking the lock;
//   - one watch stream per session for the keys of all its grants, so a
//     revoked lease or a deleted key is noticed in milliseconds;
//   - guarded writes that refuse to touch the lock's own keys;
//   - etcd's permission errors mapped to holdfast.ErrPermissionDenied;
//   - a handoff driven by watches that start in the future, so it does not
//     wait for the server's 100 ms unsynced-watcher loop.
//
// # Secured clusters
//
// [Dial] connects over TLS with [WithTLS] or [WithTLSFiles] (a CA that
// vouches for the servers, and a client certificate for mutual TLS) and
// authenticates with [WithCredentials] (etcd's users and roles); these apply
// to Dial only, and [NewSession] refuses them: configure your client
// (clientv3.Config TLS, Username, Password). The user's roles need
// read-write access to the locks' prefixes, and nothing else. A wrong
// password or unknown user makes Dial fail with an error wrapping
// holdfast.ErrPermissionDenied; a role without the prefix makes Lock and
// TryLock fail so, with nothing written. etcd's client waits for a usable
// connection, so an unknown CA or a refused client certificate makes Dial
// fail when its context ends, with the TLS handshake's answer in the error.
// Passwords and key material never appear in errors.
package etcd
