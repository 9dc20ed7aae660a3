package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// checkElection checks the election rows of sum: one per implementation
// (and lock-delay), every repeat measured, no error, failover within
// bound, and the JSON fields.
func checkElection(t *testing.T, sum Summary, backend string, reps int, bound time.Duration) {
	t.Helper()
	n := 0
	for _, r := range sum.Results {
		if r.Scenario != ScenarioElection {
			continue
		}
		n++
		t.Logf("%s %s: failover %s ms %v, observe %s ms (lock-delay %s ms)", backend, r.Impl, fp(r.FailoverMS), r.FailoverAll, fp(r.ObserveMS), fp(r.LockDelayMS))
		if r.Backend != backend || r.Errors != 0 || r.Acquisitions != reps || len(r.FailoverAll) != reps || r.FailoverMS == nil || r.ObserveMS == nil {
			t.Errorf("row %+v", r)
			continue
		}
		if r.Impl == ImplHoldfast && *r.FailoverMS > float64(bound.Milliseconds()) {
			t.Errorf("holdfast failover %v ms, more than %v", *r.FailoverMS, bound)
		}
		b, _ := json.Marshal(r)
		for _, k := range []string{`"failover_ms":`, `"observe_ms":`, `"ttl_s":`, `"lock_delay_ms":`} {
			if !strings.Contains(string(b), k) {
				t.Errorf("JSON lacks %s: %s", k, b)
			}
		}
		if backend == "consul" && r.LockDelayMS == nil {
			t.Errorf("no lock_delay_ms on Consul: %s", b)
		}
	}
	if n != 2 {
		t.Errorf("%d election rows, want 2", n)
	}
	if len(sum.Ratios) != 1 || sum.Ratios[0].FailoverMS == nil {
		t.Errorf("ratios %+v", sum.Ratios)
	}
	var out bytes.Buffer
	if err := WriteTable(&out, sum); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
}

func TestEtcdElectionShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	target, err := StartEtcd()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	sum, err := Run(context.Background(), target, ScenarioElection, Options{TTL: 2 * time.Second, Repeats: 2})
	if err != nil {
		t.Fatal(err)
	}
	checkElection(t, sum, "etcd", 2, 2*time.Second+500*time.Millisecond)
}

func TestConsulElectionShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Consul agent")
	}
	target, err := StartConsul()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	delay := 300 * time.Millisecond
	sum, err := Run(context.Background(), target, ScenarioElection, Options{LockDelays: []time.Duration{delay}, Repeats: 2})
	if err != nil {
		t.Fatal(err)
	}
	checkElection(t, sum, "consul", 2, delay+500*time.Millisecond)
}
