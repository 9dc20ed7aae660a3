package consul

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-cleanhttp"
)

// TestMultiCost measures an uncontended two-name acquisition and release
// (MultiMutex) against two single Mutexes locked in order and released:
// HTTP requests per acquisition+release (blocking queries left out) and
// the p50/p90 of the time it takes, over 200 rounds each, alternating. A
// multi-name lock adds no request to the single locks it is made of.
func TestMultiCost(t *testing.T) {
	t.Parallel()
	a := agent(t)
	base := cleanhttp.DefaultPooledTransport()
	t.Cleanup(base.CloseIdleConnections)
	tr := &countingTransport{next: base}
	cli, err := a.NewClient(func(cfg *api.Config) { cfg.HttpClient = &http.Client{Transport: tr} })
	if err != nil {
		t.Fatal(err)
	}
	// A long TTL: no renewal (a request) falls in a round.
	s := newSession(t, cli, WithLockDelay(0), WithTTL(time.Hour))
	name := uniqueName(t)
	ctx := context.Background()
	multi, err := NewMultiMutex(s, name+"/b", name+"/a")
	if err != nil {
		t.Fatal(err)
	}
	ma, mb := newMutex(t, s, name+"/a"), newMutex(t, s, name+"/b")
	const rounds = 200
	var multiD, singleD []time.Duration
	var multiR, singleR int64
	for range rounds {
		r0, t0 := tr.n.Load(), time.Now()
		g, err := multi.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		multiD, multiR = append(multiD, time.Since(t0)), multiR+tr.n.Load()-r0

		r0, t0 = tr.n.Load(), time.Now()
		ga, err := ma.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gb, err := mb.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := ga.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := gb.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		singleD, singleR = append(singleD, time.Since(t0)), singleR+tr.n.Load()-r0
	}
	slices.Sort(multiD)
	slices.Sort(singleD)
	mr, sr := float64(multiR)/rounds, float64(singleR)/rounds
	t.Logf("Consul, uncontended, lock+unlock of 2 names, %d rounds: MultiMutex %.2f requests, p50 %v, p90 %v; two Mutexes in order %.2f requests, p50 %v, p90 %v",
		rounds, mr, multiD[rounds/2].Round(time.Microsecond), multiD[rounds*9/10].Round(time.Microsecond),
		sr, singleD[rounds/2].Round(time.Microsecond), singleD[rounds*9/10].Round(time.Microsecond))
	if mr > sr+0.1 {
		t.Errorf("a two-name lock costs %.2f requests, two single locks %.2f: want no more", mr, sr)
	}
}
