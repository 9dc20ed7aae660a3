// Package holdfast defines one set of interfaces for distributed locks over
// etcd and Consul, with a fencing token on every grant. The locks are in
// the backends' packages, github.com/holdfast/holdfast/etcd and
// github.com/holdfast/holdfast/consul (the same calls); on etcd, with
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
// These lines are the body of package etcd's ExampleMutex_Lock, which the
// tests module runs against a real etcd (package consul's ExampleDial does
// the same on Consul). What those lines rely on:
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
// The backends' locks return their own grant types (*etcd.Grant, *consul.Grant), which add
// guarded writes: store operations that commit only while the grant is still
// held. [AsLocker] turns any of them into a [Locker] for code that should not
// depend on the store. Both pass the same conformance suite
// (holdfast/conformance), so the semantics described here hold on both.
//
// Lock names follow one rule on every store: see [ValidateName].
package holdfast
