package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/leakcheck"
)

// TestQuick is the smoke test of the quick run (`holdfast bench --quick`,
// every registered scenario with its quick settings) on each store. It checks
// structure only, nothing about speed: every scenario of "all" has rows, no
// row saw a violation or an error, every contended setting has a floor row
// and of_floor on its other rows, the waiters rows have their waiters and
// bytes, and the table and JSON output carry them. Under the race detector
// (`make test`) the contender and waiter counts are cut to at most 4: -race
// makes every client several times slower, and with the machine shared, a
// 17-contender native row could then make no acquisition at all in its
// 200 ms windows (measured: 0 to 2), which would leave nothing to check. The
// quick run takes about 15 s per store either way.
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd and a Consul agent")
	}
	for _, backend := range []string{"etcd", "consul"} {
		t.Run(backend, func(t *testing.T) {
			leakcheck.Check(t)
			target := startTarget(t, backend)
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			var log strings.Builder
			var lines bytes.Buffer
			opts := Options{
				Quick:    true,
				Log:      &log,
				OnResult: func(r Result) { WriteJSON(&lines, r) },
				OnRatio:  func(q Ratio) { WriteRatioJSON(&lines, q) },
				OnOther:  func(row any) { WriteJSON(&lines, row) },
			}
			if raceEnabled {
				opts.Contenders, opts.Waiters = []int{1, 3}, []int{2, 4}
			}
			start := time.Now()
			sum, err := Run(ctx, target, ScenarioAll, opts)
			t.Logf("quick run on %s: %v", backend, time.Since(start))
			if err != nil {
				t.Fatalf("Run: %v\n%s", err, log.String())
			}
			checkQuick(t, backend, sum, lines.Bytes(), quickWaiters(opts).Waiters)
			var table bytes.Buffer
			if err := WriteTable(&table, sum); err != nil {
				t.Fatal(err)
			}
			t.Log("\n" + table.String())
			for _, col := range []string{"vs_native", "of_floor", "bytes/acq", "floor", "waiters"} {
				if !strings.Contains(table.String(), col) {
					t.Errorf("table lacks %q", col)
				}
			}
		})
	}
}

// checkQuick checks the summary and the JSON lines of a quick run.
func checkQuick(t *testing.T, backend string, sum Summary, lines []byte, wantWaiters []int) {
	t.Helper()
	if sum.Failed() {
		t.Errorf("violations %d, errors %d", sum.Violations, sum.Errors)
	}
	seen := map[string]int{}
	floors := map[string]bool{} // settings with a floor row
	for _, r := range sum.Results {
		seen[r.Scenario]++
		b, _ := json.Marshal(r)
		if r.Backend != backend || r.Violations != 0 || r.Errors != 0 {
			t.Errorf("row %s", b)
		}
		if r.Impl == ImplFloor {
			floors[settingKey(r)] = true
		}
	}
	for _, o := range sum.Other {
		var row struct {
			Scenario   string `json:"scenario"`
			Violations int    `json:"violations"`
			Errors     int    `json:"errors"`
		}
		b, err := json.Marshal(o)
		if err != nil || json.Unmarshal(b, &row) != nil {
			t.Errorf("other row %T does not marshal to JSON with a scenario: %v", o, err)
			continue
		}
		seen[row.Scenario]++
		if row.Violations != 0 || row.Errors != 0 {
			t.Errorf("row %s", b)
		}
	}
	for _, spec := range registry {
		if spec.inAll && seen[spec.name] == 0 {
			t.Errorf("no rows of scenario %s", spec.name)
		}
	}
	contended := []string{ScenarioLock, ScenarioHandoff, ScenarioSemaphore, ScenarioWaiters}
	var waiters []int
	for _, r := range sum.Results {
		if !slices.Contains(contended, r.Scenario) {
			continue
		}
		b, _ := json.Marshal(r)
		if !floors[settingKey(r)] {
			t.Errorf("no floor row for %s", b)
		}
		if (r.Impl == ImplFloor) != (r.OfFloor == nil) {
			t.Errorf("of_floor: want it on every row but the floor's: %s", b)
		}
		if r.Acquisitions == 0 || r.RPCsPerAcq == nil || r.BytesPerAcq == nil || r.Rounds != 3 || r.Nodes != 1 {
			t.Errorf("want acquisitions, rpcs and bytes per acquisition, 3 rounds, 1 node: %s", b)
		}
		if r.Scenario == ScenarioWaiters {
			if r.Waiters == nil || r.Contenders != *r.Waiters+1 {
				t.Errorf("waiters row without its waiters: %s", b)
			} else if r.Impl == ImplHoldfast {
				waiters = append(waiters, *r.Waiters)
			}
		}
	}
	if !slices.Equal(waiters, wantWaiters) {
		t.Errorf("waiters rows for %v, want %v", waiters, wantWaiters)
	}
	// Every JSON line is an object: a row or a {"ratio": ...}.
	n := 0
	for line := range bytes.Lines(lines) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Errorf("JSON line %q: %v", line, err)
		}
		if _, ok := m["ratio"]; !ok {
			n++
			if _, ok := m["scenario"]; !ok {
				t.Errorf("JSON row without scenario: %s", line)
			}
		}
	}
	if n != len(sum.Results)+len(sum.Other) {
		t.Errorf("%d JSON rows, want %d", n, len(sum.Results)+len(sum.Other))
	}
}

// settingKey identifies a row's setting (what its floor shares).
func settingKey(r Result) string {
	b, _ := json.Marshal([]any{r.Scenario, r.Contenders, r.HoldMS, r.Limit, r.Waiters, r.Nodes})
	return string(b)
}
