// Package conformance is the semantic test suite every holdfast backend must
// pass. It is imported from a backend's _test.go files, the way
// golang.org/x/net/nettest is, and drives the backend only through the
// holdfast.Locker and holdfast.Grant interfaces plus a few hooks described
// by [Backend]: a way to make a locker on a session of its own, a way to
// kill that session from outside, and a way to list the keys under a lock
// name through an independent client.
//
// A backend's test looks like this:
//
//	func TestConformance(t *testing.T) {
//		leakcheck.Check(t) // first, so that its check runs last
//		cli := embedtest.Etcd(t)
//		conformance.Run(t, conformance.Backend{
//			NewLocker: func(t *testing.T, name string, opts ...holdfast.LockOption) (holdfast.Locker, func()) {
//				// a new client session for name; kill revokes its lease
//				// through another client; everything is closed with t
//			},
//			Keys: func(t *testing.T, name string) []string {
//				// every key under name+"/", read through another client, sorted
//			},
//			LossNotice: ttl/3 + 2*time.Second,
//		})
//	}
//
// [Run] runs one subtest per property (MutualExclusion, FIFO, TryLock,
// CancelCleanup, MonotonicTokens, LossNotice, DoubleUnlock, Reentrancy,
// ContextWhileWaiting, BadInput), each on a fresh lock name of the form
// "conformance/<subtest>/<random>", so a single property can be run with
// go test -run 'TestConformance/FIFO'. The subtests are sequential (they
// measure waits, so they do not call t.Parallel). Every wait in the suite is
// bounded: a backend that hangs makes a subtest fail, never the test binary
// time out.
//
// What the suite checks is the contract written on holdfast.Locker and
// holdfast.Grant: mutual exclusion, fencing tokens that strictly increase,
// first-come order, TryLock that fails at once with holdfast.ErrLocked,
// context cancellation that leaves no key behind, a grant context cancelled
// with a cause wrapping holdfast.ErrLost when the session dies, guarded
// Unlock (holdfast.ErrNotHeld, and nobody else's key touched), and opt-in
// reentrancy.
package conformance
