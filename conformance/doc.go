// Package conformance is the semantic test suite every holdfast backend must
// pass. It is imported from a backend's _test.go files, the way
// golang.org/x/net/nettest is, and drives the backend only through the
// holdfast.Locker and holdfast.Grant interfaces plus the hooks described by
// [Backend]: a way to make a locker on a session of its own with the faults
// that can be injected around it ([Faults]: kill the session, cut or freeze
// its connection, close it, count its requests), a way to delete a key as an
// operator would, and a way to list the keys under a lock name through an
// independent client.
//
// A backend's test looks like this:
//
//	func TestConformance(t *testing.T) {
//		leakcheck.Check(t) // first, so that its check runs last
//		c := etcdtest.Etcd(t)
//		conformance.Run(t, conformance.Backend{
//			NewLocker: func(t *testing.T, name string, opts ...holdfast.LockOption) (holdfast.Locker, conformance.Faults) {
//				// a client through an embedtest.Proxy, a session, a Mutex
//				// adapted with holdfast.AsLocker; faults act on them
//			},
//			Keys:   func(t *testing.T, name string) []string { ... },
//			Delete: func(t *testing.T, key string) { ... },
//			TTL:    ttl, Margin: ttl / 5,
//			LossNotice: 2 * time.Second,
//		})
//	}
//
// [Run] runs one subtest per property, each on a fresh lock name of the form
// "conformance/<subtest>/<random>", so a single property can be run with go
// test -run 'TestConformance/FIFO'. The subtests are sequential (they
// measure waits, so they do not call t.Parallel). Every wait in the suite is
// bounded: a backend that hangs makes a subtest fail, never the test binary
// time out.
//
// The properties, from the contract written on holdfast.Locker and
// holdfast.Grant:
//
//   - MutualExclusion: one holder at a time; tokens strictly increase and a
//     Fence admits every write.
//   - FIFO: waiters are granted in arrival order. NoHerd: a release wakes
//     only the next waiter (the others send almost no request).
//   - TryLock: fails at once with ErrLocked while the lock is held, and while
//     a waiter is next in line although nobody holds it (no barging).
//   - CancelCleanup: a Lock whose context ends returns its error and leaves
//     no key (once the background cleanup has run).
//   - MonotonicTokens: non-zero, increasing tokens; the key is under the
//     name; the context ends with ErrReleased on Unlock.
//   - LossNotice: a killed session's grant ends (ErrLost) within LossNotice;
//     its late Unlock fails with ErrNotHeld and touches nobody else.
//   - ToldBeforeNextGrant: a holder cut off from the store is told at its
//     own deadline (never more than TTL - Margin ahead), before the waiter
//     queued behind it is granted.
//   - DeletedKey: a key deleted by an operator ends the grant; its stale
//     Unlock touches neither another session's grant nor a newer grant of
//     its own session.
//   - SessionClose: Close ends grants with ErrSessionClosed and removes keys.
//   - DoubleUnlock, Reentrancy, ContextWhileWaiting: guarded and repeated
//     Unlock, opt-in reentrancy, a waiter whose session dies returns.
//   - BoundedLock, BoundedUnlock: calls return within milliseconds of their
//     context (or their session) ending, even with the store frozen; the
//     release and the cleanup go on in the background.
//   - NestedNames: a lock whose name has a longer name in use under it fails
//     with ErrConflict.
//   - Liveness: once the lock is free, a live waiter is granted within 1 s,
//     even when a waiter queued beside it gave up (its Lock cancelled);
//     also for a semaphore of limit 1 and a read-write lock's writers when
//     the backend has them.
//   - BadInput: a nil context is ErrInvalidArgument.
//
// Properties of the optional primitives, run only when the Backend sets
// their constructor (Run logs the ones it leaves out; none is skipped):
//
//   - Semaphore (Backend.NewSemaphore): SemaphoreLimit, never more than the
//     limit of live permits at once (a fenced counter: a permit counts while
//     its context lives), and the limit is reached; SemaphoreTryLock,
//     ErrLocked at once when full, writing nothing; SemaphoreKilledHolder,
//     a killed session's permit comes back within OpTimeout;
//     SemaphoreCancelCleanup, a cancelled wait leaves nothing behind;
//     SemaphoreLimitMismatch, clients that disagree on the limit get
//     ErrConflict at once, never over-admission.
//   - Read-write lock (Backend.NewRWMutex, an [RWLocker]): RWExclusion, never
//     a writer beside anyone, and fenced write tokens; RWReadersShare, four
//     readers at once, and TryLock/TryRLock fail with ErrLocked across
//     kinds; RWWriterNotStarved, a reader arriving after a queued writer
//     waits behind it; RWCancelCleanup; RWTokens, write tokens strictly
//     increase. RWReentrancy (Backend.TryNewRWMutex): a read-write lock
//     is not reentrant, its constructor refuses holdfast.WithReentrant
//     (ErrInvalidArgument), and a second Lock or RLock through a lock that
//     holds it waits like any other contender's.
//   - Election (Backend.NewElection, a leader.Candidate): ElectionOneLeader,
//     at most one live leadership at a time, terms strictly increasing, fenced
//     writes admitted; ElectionObserve, Observe starts with the current state
//     and delivers leaders in term order (every one of them with
//     Backend.ObserveAll, even to a slow reader), ending with "no leader";
//     ElectionObserveWinners, Observe never reports a candidate whose
//     Campaign was cancelled before its turn came;
//     ElectionLeader, ErrNoLeader when nobody leads, the leader otherwise, and
//     a cancelled Campaign leaves nothing; ElectionResign, a resigning
//     leader's context ends before the next leader's Campaign returns;
//     ElectionFailover, a killed leader is told within LossNotice and the
//     next candidate wins within OpTimeout with a higher term.
//   - Once-per-period claim (Backend.NewClaimer, a [Claimer]): ClaimOnce, of
//     5 claimants of a period exactly one gets it and the others get
//     ErrClaimed at once, Unlock keeps the run marked until AtLeast (the
//     next period is refused meanwhile), the same period is refused after
//     the run, the next period's claim succeeds with a higher token, and
//     the record is the one key left; ClaimLate, no period is claimed
//     twice whatever the delays: the same period past ClaimFree,
//     an earlier period after a later one, and a period already over
//     (ErrPeriodOver) are refused; ClaimAtMost,
//     a claimant cut off while holding is told (its context ends) before
//     anyone else can claim, and the claim is free by AtMost + ClaimFree;
//     ClaimTicks, 5 claimants with offsets up to AtLeast/2, one crashing in
//     the second period, until a period starts past the crashed claim's
//     AtMost + ClaimFree: at most one run per period, exactly one where
//     nothing could block it.
//   - Multi-name lock (Backend.NewMultiLocker, a [MultiLocker]):
//     MultiNoDeadlock, 8 clients locking random subsets (2 to 4) of 6 names
//     in random order never deadlock, never overlap on a name, and tokens of
//     each name increase; MultiCancel, a cancelled acquisition leaves nothing
//     held or queued; MultiLoss, a deleted part ends the grant's context
//     (cause naming it) and Unlock releases the rest; MultiFIFO, waiters
//     queued on a held name get the multi-name lock in arrival order.
//
// The suite is itself tested against a fake store with 57 deliberate bugs
// (in locks, semaphores, read-write locks, elections, claims and multi-name
// locks), each of which some property must catch.
package conformance
