package consul_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
)

// ExampleMutex takes a lock, does fenced work under it, and releases it.
func ExampleMutex() {
	forExamplesRunAgainstAnAgent(func(addr string) {
		cfg := api.DefaultConfig() // and $CONSUL_HTTP_TOKEN, $CONSUL_CACERT...
		cfg.Address = addr
		client, err := api.NewClient(cfg)
		if err != nil {
			log.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		session, err := consul.NewSession(ctx, client, consul.WithTTL(10*time.Second), consul.WithLockDelay(0))
		if err != nil {
			log.Fatal(err)
		}
		defer session.Close()
		mu, err := consul.NewMutex(session, "jobs/nightly-report")
		if err != nil {
			log.Fatal(err)
		}

		g, err := mu.Lock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("holding", g.Key())

		// Work under g.Context(): it is cancelled if the lock is lost. Writes to
		// another system carry g.Token(), which that system checks.
		var fence holdfast.Fence
		if err := fence.Admit(g.Token()); err != nil {
			log.Fatal(err)
		}
		fmt.Println("token admitted:", g.Token() > 0)

		// Another session cannot take the lock meanwhile.
		other, err := consul.NewSession(ctx, client, consul.WithLockDelay(0))
		if err != nil {
			log.Fatal(err)
		}
		defer other.Close()
		omu, err := consul.NewMutex(other, "jobs/nightly-report")
		if err != nil {
			log.Fatal(err)
		}
		_, err = omu.TryLock(ctx)
		fmt.Println("other session:", errors.Is(err, holdfast.ErrLocked))

		if err := g.Unlock(ctx); err != nil {
			log.Fatal(err)
		}
		fmt.Println("released:", context.Cause(g.Context()))
	})
	// Output:
	// holding jobs/nightly-report/.lock
	// token admitted: true
	// other session: true
	// released: holdfast: grant released
}

// ExampleGrant_Txn writes to Consul's KV store only while the lock is held.
func ExampleGrant_Txn() {
	forExamplesRunAgainstAnAgent(func(addr string) {
		cfg := api.DefaultConfig() // and $CONSUL_HTTP_TOKEN, $CONSUL_CACERT...
		cfg.Address = addr
		client, err := api.NewClient(cfg)
		if err != nil {
			log.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		session, err := consul.NewSession(ctx, client, consul.WithLockDelay(0))
		if err != nil {
			log.Fatal(err)
		}
		defer session.Close()
		mu, err := consul.NewMutex(session, "config/leader")
		if err != nil {
			log.Fatal(err)
		}
		g, err := mu.Lock(ctx)
		if err != nil {
			log.Fatal(err)
		}

		set := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: "config/current", Value: []byte("v1")}}}
		if _, err := g.Txn(ctx, set); err != nil {
			log.Fatal(err)
		}
		fmt.Println("written while held")

		// The lock's own keys are off limits: refused before any request.
		own := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: g.Key(), Value: []byte("x")}}}
		_, err = g.Txn(ctx, own)
		fmt.Println("own key refused:", errors.Is(err, holdfast.ErrInvalidArgument))

		if err := g.Unlock(ctx); err != nil {
			log.Fatal(err)
		}
		_, err = g.Txn(ctx, set)
		fmt.Println("after Unlock:", errors.Is(err, holdfast.ErrNotHeld))
	})
	// Output:
	// written while held
	// own key refused: true
	// after Unlock: true
}

// ExampleDial takes a lock, writes under it and releases it: the lines the
// package doc shows. Dial opens the session on a client of its own.
func ExampleDial() {
	forExamplesRunAgainstAnAgent(func(addr string) {
		ctx := context.Background()
		s, err := consul.Dial(ctx, addr, consul.WithLockDelay(0)) // addr "": $CONSUL_HTTP_ADDR, else 127.0.0.1:8500
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		m, err := consul.NewMutex(s, "jobs/nightly-report")
		if err != nil {
			log.Fatal(err)
		}
		g, err := m.Lock(ctx) // waits its turn; g.Context() ends if the lock is lost
		if err != nil {
			log.Fatal(err)
		}
		defer func() {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = g.Unlock(uctx) // if Consul does not answer in time, the session releases it later
		}()
		// g.Token() fences writes elsewhere; g.Txn commits only while the lock is held.
		record := fmt.Sprintf("done under token %d", g.Token())
		set := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: "reports/last", Value: []byte(record)}}}
		if _, err := g.Txn(g.Context(), set); err != nil {
			log.Fatal(err)
		}

		fmt.Println("holding", g.Key())
	})
	// Output:
	// holding jobs/nightly-report/.lock
}

// ExampleLockKey shows the key to give api.Lock (or `consul lock`) to share a
// lock with holdfast.
func ExampleLockKey() {
	fmt.Println(consul.LockKey("jobs/nightly-report"))
	// api.Lock users: client.LockOpts(&api.LockOptions{Key: consul.LockKey(name)})
	// Shell: consul lock jobs/nightly-report ./run-report.sh
	// Output:
	// jobs/nightly-report/.lock
}

// ExampleSemaphore bounds work across processes: at most two permits of
// "jobs/render" at once, shared with api.Semaphore and `consul lock -n 2
// jobs/render cmd`.
func ExampleSemaphore() {
	forExamplesRunAgainstAnAgent(func(addr string) {
		cfg := api.DefaultConfig() // and $CONSUL_HTTP_TOKEN, $CONSUL_CACERT...
		cfg.Address = addr
		client, err := api.NewClient(cfg)
		if err != nil {
			log.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		// Three workers, each with its own session (as three processes would).
		var sems []*consul.Semaphore
		for range 3 {
			s, err := consul.NewSession(ctx, client, consul.WithLockDelay(0))
			if err != nil {
				log.Fatal(err)
			}
			defer s.Close()
			sem, err := consul.NewSemaphore(s, "jobs/render", 2)
			if err != nil {
				log.Fatal(err)
			}
			sems = append(sems, sem)
		}
		a, err := sems[0].Lock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		b, err := sems[1].Lock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		_, err = sems[2].TryLock(ctx)
		fmt.Println("third permit while two are held:", errors.Is(err, holdfast.ErrLocked))

		// Work under a.Context() (cancelled if the permit is lost); Unlock hands
		// the permit to the first waiter.
		if err := a.Unlock(ctx); err != nil {
			log.Fatal(err)
		}
		c, err := sems[2].Lock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("third permit after a release; newer token:", c.Token() > a.Token())
		_ = b.Unlock(ctx)
		_ = c.Unlock(ctx)
	})
	// Output:
	// third permit while two are held: true
	// third permit after a release; newer token: true
}

// ExampleRWMutex shares a lock among readers, excludes them for a writer,
// and downgrades a write grant to a read grant.
func ExampleRWMutex() {
	forExamplesRunAgainstAnAgent(func(addr string) {
		cfg := api.DefaultConfig() // and $CONSUL_HTTP_TOKEN, $CONSUL_CACERT...
		cfg.Address = addr
		client, err := api.NewClient(cfg)
		if err != nil {
			log.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		var rws []*consul.RWMutex
		for range 2 {
			s, err := consul.NewSession(ctx, client, consul.WithLockDelay(0))
			if err != nil {
				log.Fatal(err)
			}
			defer s.Close()
			rw, err := consul.NewRWMutex(s, "config/routes")
			if err != nil {
				log.Fatal(err)
			}
			rws = append(rws, rw)
		}
		r, err := rws[0].RLock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		_, err = rws[1].TryLock(ctx)
		fmt.Println("writer beside a reader:", !errors.Is(err, holdfast.ErrLocked))
		if err := r.Unlock(ctx); err != nil {
			log.Fatal(err)
		}

		w, err := rws[1].Lock(ctx) // write, then go on reading without a gap
		if err != nil {
			log.Fatal(err)
		}
		rd, err := rws[1].Downgrade(ctx, w)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("write grant ended:", errors.Is(context.Cause(w.Context()), holdfast.ErrReleased))
		r2, err := rws[0].RLock(ctx) // readers share with the downgraded grant
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("read grant keeps the write's token:", rd.Token() == w.Token())
		fmt.Println("a later reader's token is newer:", r2.Token() > w.Token())
		_ = r2.Unlock(ctx)
		_ = rd.Unlock(ctx)
	})
	// Output:
	// writer beside a reader: false
	// write grant ended: true
	// read grant keeps the write's token: true
	// a later reader's token is newer: true
}
