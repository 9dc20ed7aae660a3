// Package holdfast defines one set of interfaces for distributed locks over
// etcd and Consul, with a fencing token on every grant.
//
// A lease-based lock can be lost without its holder noticing: a long GC
// pause, a slow network or a suspended VM lets the lease expire while the
// holder still runs, and another client is granted the same lock. No lock
// service can prevent that by itself. holdfast gives the two things that make
// it safe anyway:
//
//   - a fencing token ([Token]) on every [Grant]: a number that strictly
//     increases across grants of the same lock, so the protected resource can
//     refuse writes that carry an older token than one it has already seen
//     (see [Fence] for an in-memory example);
//   - a context on every grant ([Grant.Context]) that is cancelled before the
//     store could give the lock to another client, so the holder learns of the
//     loss in time to stop.
//
// Backends live in sub-packages: holdfast/etcd and holdfast/consul. Their
// locks return their own grant types (*etcd.Grant, *consul.Grant), which add
// guarded writes: store operations that commit only while the grant is still
// held. [AsLocker] turns any of them into a [Locker] for code that should not
// depend on the store. Both pass the same conformance suite
// (holdfast/conformance), so the semantics described here hold on both.
//
// Lock names follow one rule on every store: see [ValidateName].
package holdfast
