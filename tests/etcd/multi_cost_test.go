package etcd_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// TestMultiCost measures an uncontended two-name acquisition and release
// (MultiMutex) against two single Mutexes locked in order and released:
// unary requests per acquisition+release and the p50/p90 of the time it
// takes, over 200 rounds each, alternating. A multi-name lock adds no
// request to the single locks it is made of.
func TestMultiCost(t *testing.T) {
	c := etcdtest.Etcd(t)
	var requests atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		requests.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli := c.Client(t, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(count))
	})
	s, err := etcd.NewSession(context.Background(), cli)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	multi, err := etcd.NewMultiMutex(s, "cost/b", "cost/a")
	if err != nil {
		t.Fatal(err)
	}
	a, b := newMutex(t, s, "cost/a"), newMutex(t, s, "cost/b")
	const rounds = 200
	var multiD, singleD []time.Duration
	var multiR, singleR int64
	for range rounds {
		// Keepalives are unary requests too: count only the rounds' own.
		r0, t0 := requests.Load(), time.Now()
		g, err := multi.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		multiD, multiR = append(multiD, time.Since(t0)), multiR+requests.Load()-r0

		r0, t0 = requests.Load(), time.Now()
		ga, err := a.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gb, err := b.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := ga.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := gb.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		singleD, singleR = append(singleD, time.Since(t0)), singleR+requests.Load()-r0
	}
	slices.Sort(multiD)
	slices.Sort(singleD)
	mr, sr := float64(multiR)/rounds, float64(singleR)/rounds
	t.Logf("etcd, uncontended, lock+unlock of 2 names, %d rounds: MultiMutex %.2f requests, p50 %v, p90 %v; two Mutexes in order %.2f requests, p50 %v, p90 %v",
		rounds, mr, multiD[rounds/2].Round(time.Microsecond), multiD[rounds*9/10].Round(time.Microsecond),
		sr, singleD[rounds/2].Round(time.Microsecond), singleD[rounds*9/10].Round(time.Microsecond))
	if mr > sr+0.1 {
		t.Errorf("a two-name lock costs %.2f requests, two single locks %.2f: want no more", mr, sr)
	}
}
