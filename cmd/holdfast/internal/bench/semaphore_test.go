package bench

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/leakcheck"
)

// TestSemaphoreShort runs a very short semaphore scenario on each store
// (holdfast alone on etcd; holdfast and api.Semaphore on Consul) and checks
// that the rows are complete: the limit, no violation, no error, requests
// counted. It asserts nothing about performance.
func TestSemaphoreShort(t *testing.T) {
	for _, backend := range []string{"etcd", "consul"} {
		t.Run(backend, func(t *testing.T) {
			leakcheck.Check(t)
			target := startTarget(t, backend)
			hold := time.Millisecond
			var log strings.Builder
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			sum, err := Run(ctx, target, ScenarioSemaphore, Options{
				Contenders: []int{6},
				Limit:      3,
				Hold:       &hold,
				Duration:   400 * time.Millisecond,
				Warmup:     100 * time.Millisecond,
				TTL:        10 * time.Second,
				Log:        &log,
			})
			if err != nil {
				t.Fatalf("Run: %v\n%s", err, log.String())
			}
			// holdfast (and api.Semaphore on Consul), then the floor with
			// 3 tokens in its relay.
			want := map[string]int{"etcd": 2, "consul": 3}[backend]
			if len(sum.Results) != want || len(sum.Ratios) != want-2 {
				t.Fatalf("%d results and %d ratios, want %d and %d", len(sum.Results), len(sum.Ratios), want, want-2)
			}
			if fl := sum.Results[want-1]; fl.Impl != ImplFloor || fl.OfFloor != nil || sum.Results[0].OfFloor == nil {
				t.Errorf("want the floor last, of_floor on the others: %+v", sum.Results)
			}
			for _, r := range sum.Results {
				b, _ := json.Marshal(r)
				t.Logf("%s", b)
				switch {
				case r.Scenario != ScenarioSemaphore || r.Limit == nil || *r.Limit != 3 || r.Contenders != 6 || r.HoldMS != 1:
					t.Errorf("row %s: want scenario semaphore, limit 3, 6 contenders, hold 1 ms", b)
				case r.Violations != 0 || r.Errors != 0:
					t.Errorf("row %s: violations or errors", b)
				case r.Acquisitions == 0 || r.RPCsPerAcq == nil || r.Fairness == nil || r.WaitP50MS == nil:
					t.Errorf("row %s: want acquisitions, rpcs_per_acq, fairness and waits", b)
				}
			}
			if !strings.Contains(string(mustJSON(t, sum.Results[0])), `"limit":3`) {
				t.Errorf("JSON row lacks the limit")
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
