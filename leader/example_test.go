package leader_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/leader"
)

// Run a leader-elected worker whose writes are fenced by its term.
func Example() {
	agent, err := embedtest.StartConsul() // a Consul agent for the example
	if err != nil {
		log.Fatal(err)
	}
	defer agent.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	session, err := consul.Dial(ctx, agent.HTTPAddr, consul.WithTTL(10*time.Second), consul.WithLockDelay(0))
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()
	election, err := consul.NewElection(session, "services/billing")
	if err != nil {
		log.Fatal(err)
	}

	var fence holdfast.Fence // the resource's side: refuses older terms
	err = leader.Run(ctx, election, leader.Config[*consul.Grant]{
		Value: []byte("billing-1"),
		OnStartedLeading: func(ctx context.Context, g *consul.Grant) {
			// The leader's work, under ctx: it ends when leadership does.
			if err := fence.Do(g.Token(), func() { fmt.Println("leading: writing under my term") }); err != nil {
				return
			}
			cancel() // stop the example after one term
		},
		OnStoppedLeading: func(g *consul.Grant) {
			fmt.Println("stopped leading:", context.Cause(g.Context()))
		},
		ResignOnCancel: true,
	})
	fmt.Println("Run:", err)
	// Output:
	// leading: writing under my term
	// stopped leading: holdfast: grant released
	// Run: <nil>
}
