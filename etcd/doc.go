// Package etcd implements holdfast's locks on etcd leases and
// revision-ordered keys.
//
// A Session is one lease, kept alive in the background and shared by every
// grant taken through it. A Mutex is a FIFO lock with the key layout of
// go.etcd.io/etcd/client/v3/concurrency.Mutex (keys "<name>/<lease ID in
// hex>", the holder being the key with the lowest create revision), so
// `etcdctl lock <name>` and concurrency.NewMutex(session, name) exclude
// holdfast on the same name, and the other way round.
//
// What holdfast adds over the concurrency recipe:
//
//   - a fencing token on every grant: the create revision of the holder's key;
//   - guarded writes (Grant.Txn) that commit only while the grant holds;
//   - a grant context cancelled before the lease can expire on the server
//     (WithMargin documents the assumption);
//   - a guarded Unlock that can never delete a newer grant's key;
//   - waiters that leave no key behind on any error, notice their session's
//     loss promptly, and re-check their own key before taking the lock;
//   - a handoff driven by watches that start in the future, so it does not
//     wait for the server's 100 ms unsynced-watcher loop.
package etcd
