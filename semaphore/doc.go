// Package semaphore runs work under a fleet-wide limit held by the store:
// "at most N of these functions at once, across every process".
//
// Looking for a counting semaphore itself? Each backend has one, a
// holdfast.GrantLocker whose grants are permits:
//
//   - etcd.NewSemaphore(session, name, limit): contender keys
//     "<name>/<lease ID in hex>" ordered by create revision; a contender
//     holds a permit when fewer than limit keys were created before its own.
//   - consul.NewSemaphore(session, name, limit): the layout of Consul's
//     api.Semaphore and `consul lock -n`, so those clients share permits
//     with holdfast.
//
// A permit is a grant like a lock's: a key, a fencing token, a context
// cancelled before the store could give the permit to someone else, and
// guarded writes. Clients that disagree on the limit get an error wrapping
// holdfast.ErrConflict, never over-admission.
//
// This package adds [Group], shaped like golang.org/x/sync/errgroup.Group
// after SetLimit, except that the limit is the store's: [Group.Go] runs a
// function once a permit is granted, under a context that is cancelled if
// the permit is lost, and releases the permit when the function returns;
// [Group.Wait] returns the first error.
//
// # One permit per session, so one locker per slot
//
// A session holds at most one permit of a semaphore at a time: both stores
// key contenders by session (etcd lease, Consul session), so two Lock calls
// through one session take turns in-process rather than taking two
// permits. A Group that should run k functions of this process at once
// therefore needs k lockers, each on a session of its own:
//
//	lockers := make([]holdfast.Locker, k)
//	for i := range lockers {
//		s, _ := etcd.NewSession(ctx, cli) // one lease per slot
//		sem, _ := etcd.NewSemaphore(s, "jobs/encode", 4)
//		lockers[i] = holdfast.AsLocker[*etcd.Grant](sem)
//	}
//	g, _ := semaphore.NewGroup(ctx, lockers...)
//
// The number of lockers is the group's local parallelism (k); the store's
// limit (4 above) bounds the whole fleet. Sessions are cheap (one lease or
// session, renewed in the background), but each is one more contender in
// the store, so k need not exceed the limit.
//
// # Local fan-in
//
// Go blocks while all k lockers are busy, as errgroup.Group.Go does after
// SetLimit (the Group is built on errgroup). A process that submits 10,000
// tasks therefore has at most k of them contending in the store at any
// moment, and at most k contender keys there: the others wait in this
// process, costing the store nothing.
package semaphore
