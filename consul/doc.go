// Package consul is the Consul backend of holdfast: fair, fenced locks over
// Consul sessions and the KV store, built on github.com/hashicorp/consul/api.
// Take a lock, write under it, release it (the body of ExampleDial):
//
//	s, err := consul.Dial(ctx, addr, consul.WithLockDelay(0)) // addr "": $CONSUL_HTTP_ADDR, else 127.0.0.1:8500
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer s.Close()
//	m, err := consul.NewMutex(s, "jobs/nightly-report")
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
//		_ = g.Unlock(uctx) // if Consul does not answer in time, the session releases it later
//	}()
//	// g.Token() fences writes elsewhere; g.Txn commits only while the lock is held.
//	record := fmt.Sprintf("done under token %d", g.Token())
//	set := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: "reports/last", Value: []byte(record)}}}
//	if _, err := g.Txn(g.Context(), set); err != nil {
//		log.Fatal(err)
//	}
//
// A [Session] is one Consul session, renewed in the background and shared
// by every lock taken through it ([Dial] opens one on a client of its own,
// [NewSession] on yours). The primitives use the key layouts of Consul's own
// clients, which they exclude and are excluded by: a [Mutex] or an
// [Election] holds "<name>/.lock" as api.Lock and `consul lock` do; a
// [Semaphore] and an [RWMutex] use api.Semaphore's layout; a [Once] claims a
// name once per period. Every grant has a fencing token and a Txn that
// applies only while it is held. Errors wrap the sentinels of package
// holdfast. The algorithms are in docs/DESIGN.md, their costs in
// docs/BENCHMARKS.md.
package consul
