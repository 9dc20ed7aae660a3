package shard_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/shard"
)

// Share 4 shards among the members of a group; this one runs alone, so it
// owns them all, each fenced by its own token.
func Example() {
	agent, err := embedtest.StartConsul() // a Consul agent for the example
	if err != nil {
		log.Fatal(err)
	}
	defer agent.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	session, err := consul.Dial(ctx, agent.HTTPAddr, consul.WithTTL(10*time.Second), consul.WithLockDelay(0))
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()
	group, err := shard.New(shard.Consul(session), "tenants", shard.Config{Shards: 4, Member: "worker-1"})
	if err != nil {
		log.Fatal(err)
	}

	var mu sync.Mutex
	var started []int
	fences := make([]holdfast.Fence, 4) // the resource's side: one fence per shard
	err = group.Run(ctx, func(ctx context.Context, s shard.Shard, g *consul.Grant) {
		// The shard's work, under ctx: it ends when the shard moves or
		// is lost. Writes carry the shard's token.
		_ = fences[s.Index].Do(g.Token(), func() {
			mu.Lock()
			defer mu.Unlock()
			started = append(started, s.Index)
			if len(started) == 4 {
				cancel() // stop the example once every shard runs
			}
		})
		<-ctx.Done()
	})
	slices.Sort(started)
	fmt.Println("owned:", started)
	fmt.Println("Run:", err)
	// Output:
	// owned: [0 1 2 3]
	// Run: <nil>
}
