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
	"github.com/holdfast/holdfast/embedtest"
)

// Example takes a lock, does fenced work under it, and releases it.
func Example() {
	agent, err := embedtest.StartConsul() // a real `consul agent -dev`
	if err != nil {
		log.Fatal(err)
	}
	defer agent.Close()
	client, err := agent.NewClient()
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
	// Output:
	// holding jobs/nightly-report/.lock
	// token admitted: true
	// other session: true
	// released: holdfast: grant released
}

// ExampleGrant_Txn writes to Consul's KV store only while the lock is held.
func ExampleGrant_Txn() {
	agent, err := embedtest.StartConsul()
	if err != nil {
		log.Fatal(err)
	}
	defer agent.Close()
	client, err := agent.NewClient()
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

	if err := g.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = g.Txn(ctx, set)
	fmt.Println("after Unlock:", errors.Is(err, holdfast.ErrNotHeld))
	// Output:
	// written while held
	// after Unlock: true
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
