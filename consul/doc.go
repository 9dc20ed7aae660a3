// Package consul is the Consul backend of holdfast: fair, fenced locks over
// Consul sessions and the KV store, built on github.com/hashicorp/consul/api.
// Take a lock, write under it, release it, with addr your agent's HTTP
// address:
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
// These lines are the body of ExampleDial, run against a real agent by go
// test.
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
// is configurable down to 0 ([WithLockDelay]). A held lock costs no
// goroutine and about 1.4 KiB; how fast a loss is noticed: see [Session].
//
// # Locks
//
// A [Mutex] on name holds the key "<name>/.lock" ([LockKey]) with the
// session and api.Lock's flags, as api.Lock with LockOptions{Key: name +
// "/.lock"} and `consul lock name cmd` do, so they and holdfast exclude each
// other. holdfast contenders are served first come, first served; foreign
// clients get the lock only when no holdfast waiter queues. Lock, TryLock,
// Unlock and [Grant.Txn] return within milliseconds of their context ending,
// even with Consul unreachable; what must still be removed from Consul is
// removed by the session in the background while it lives. A [Grant]'s
// fencing token is the ModifyIndex of the write that acquired the key, and
// [Grant.Txn] applies only while the grant is held. Names nest as on etcd:
// a lock on "a" fails with holdfast.ErrConflict if keys of a longer name lie
// under "a/". A key used by `consul lock -n N` is refused the same way.
//
// # Semaphores and read-write locks
//
// A [Semaphore] with limit N lets at most N sessions hold a permit at once,
// in api.Semaphore's layout, so api.Semaphore and `consul lock -n N <name>
// cmd` share its permits; a client with another limit gets
// holdfast.ErrConflict naming both. An [RWMutex] (readers share, a writer
// excludes everyone, FIFO, [RWMutex.Downgrade] without a gap) uses the same
// layout with its own flags ([RWMutexFlagValue]) and lock value. Their grants
// are Grants too: the key is the holder's contender key, the token the
// ModifyIndex of the write that admitted it.
//
// # Elections
//
// An [Election] on name is Consul's documented leader-election pattern: the
// leader is the session that holds "<name>/.lock" (api.Lock's flags), and
// the key's value is the leader's proposal. Campaign returns the leadership
// as a *Grant (term = the ModifyIndex of the acquiring write, readable as
// the key's CreateIndex); Resign, Proclaim, Leader and Observe act on that
// key. leader.Run drives an Election in a loop.
//
// The algorithms are described step by step in docs/DESIGN.md, and their
// measured costs in docs/BENCHMARKS.md.
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
