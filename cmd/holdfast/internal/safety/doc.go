// Package safety is holdfast's safety suite: workloads of clients that take
// a lock (or a semaphore permit, or leadership) and write to a fenced
// resource, recorded as histories, while faults are injected into real
// clusters; and the checkers that judge the histories:
//
//   - Fence: the resource never accepted a write whose token is lower than
//     one it had accepted before (Resource records every write).
//   - Linearizable: the history of acquisitions and fenced writes is
//     linearizable against a model of a fenced mutex (tokens granted in
//     increasing order consistent with real time; each write accepted or
//     refused as a fence must), checked with porcupine.
//   - Told first (Tracker): when a client is granted a token, every grant of
//     a lower token held by another client is already over (its context
//     done), or, for a semaphore of limit N, at most N grants are live;
//     grants ended from outside (a lease revoked by an operator) are exempt,
//     since nobody can be told of those before they happen.
//   - Release (CheckReleases): for a lock or an election, an Unlock that
//     reports success was not called after a grant of a higher token had
//     returned: a holder superseded without hearing of it (its key deleted
//     from outside while its connection was frozen) must get ErrNotHeld.
//   - Liveness (CheckLiveness): every interval in which fewer grants than
//     the limit were live while a client waited in Lock (the lock free
//     while a live contender waited), its longest and its sum, each
//     attributed to the nearest fault; an interval fails the run beyond
//     1 s, or near a fault that can end a session, beyond the fault's part
//     plus the store's expiry of a session, lock-delay and 1 s.
//   - Clean: after the clients stop, no key is left under the test's
//     prefixes and no goroutine leaks (the tests check these).
//
// A workload is a Workload; faults are whatever the caller does while it
// runs. The Shard primitive runs the members of a shard group instead (see
// Shard), with a resource, history and tracker per shard, each judged by
// the same checkers. The tests in this package run short scenarios on a 3-member etcd
// cluster and a 3-server Consul cluster; "holdfast soak" runs them for as
// long as asked. TestBrokenVariants shows that the suite can fail: built
// with the tag holdfast_mutants, the scenarios of variants_test.go fail
// with each broken variant (internal/mutant) and pass without.
package safety
