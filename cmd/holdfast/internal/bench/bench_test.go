package bench

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// TestEtcdLockShort runs a very short lock scenario on an embedded etcd with
// both implementations and checks that the results are complete and sane.
// It asserts nothing about performance.
func TestEtcdLockShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	before := runtime.NumGoroutine()
	target, err := StartEtcd()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		target.Close()
		// Everything the run started must have stopped.
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before+2 {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines left running (%d before):\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
	}()

	var log strings.Builder
	var streamed []Result
	var ratios []Ratio
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err := Run(ctx, target, ScenarioLock, Options{
		Contenders: []int{2},
		Duration:   300 * time.Millisecond,
		Warmup:     100 * time.Millisecond,
		TTL:        5 * time.Second,
		Log:        &log,
		OnResult:   func(r Result) { streamed = append(streamed, r) },
		OnRatio:    func(q Ratio) { ratios = append(ratios, q) },
	})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, log.String())
	}
	if len(sum.Results) != 3 || len(streamed) != 3 {
		t.Fatalf("got %d results (%d streamed), want 3", len(sum.Results), len(streamed))
	}
	if len(ratios) != 1 || len(sum.Ratios) != 1 {
		t.Fatalf("got %d ratios, want 1", len(ratios))
	}
	for i, want := range []string{ImplHoldfast, ImplNative, ImplFloor} {
		r := sum.Results[i]
		b, _ := json.Marshal(r)
		t.Log(string(b))
		if r.Impl != want || r.Backend != "etcd" || r.Scenario != ScenarioLock || r.Contenders != 2 {
			t.Errorf("row %d: impl %q backend %q scenario %q contenders %d", i, r.Impl, r.Backend, r.Scenario, r.Contenders)
		}
		if r.Violations != 0 || r.Errors != 0 {
			t.Errorf("%s: violations %d errors %d (%s)", r.Impl, r.Violations, r.Errors, r.FirstError)
		}
		if r.Acquisitions < 1 || r.AcqPerS <= 0 || r.DurationS != 0.3 || r.HoldMS != 0 {
			t.Errorf("%s: acquisitions %d acq/s %v duration %v hold %v", r.Impl, r.Acquisitions, r.AcqPerS, r.DurationS, r.HoldMS)
		}
		// Both recipes and the floor are FIFO: two contenders take turns,
		// so within one window their counts differ by at most 1, and over
		// the row's 3 windows by at most 3. With N acquisitions split a, b
		// and |a-b| <= 3, Jain's index N^2/(2(a^2+b^2)) = N^2/(N^2+(a-b)^2)
		// is at least N^2/(N^2+9). (Any split of 2 contenders scores at
		// least 0.5, so a bound that ignores N checks nothing: a lock that
		// let one contender take two turns in a row half the time would
		// fail this.)
		nAcq := float64(r.Acquisitions)
		if bound := nAcq*nAcq/(nAcq*nAcq+9) - 0.001; r.Fairness == nil || *r.Fairness < bound || *r.Fairness > 1 {
			t.Errorf("%s: fairness %v over %d acquisitions, want at least %.3f: two FIFO contenders take turns", r.Impl, fp(r.Fairness), r.Acquisitions, bound)
		}
		if r.RPCsPerAcq == nil || *r.RPCsPerAcq <= 0 || r.RPCUnit != "grpc-unary" {
			t.Errorf("%s: rpcs_per_acq %v unit %q", r.Impl, r.RPCsPerAcq, r.RPCUnit)
		}
		if r.Handoffs > r.Acquisitions || r.Handoffs < 0 {
			t.Errorf("%s: %d handoffs of %d acquisitions", r.Impl, r.Handoffs, r.Acquisitions)
		}
		if r.Handoffs > 0 && (r.HandoffP50MS == nil || r.HandoffP99MS == nil || *r.HandoffP50MS > *r.HandoffP99MS || *r.HandoffP50MS < 0) {
			t.Errorf("%s: handoff p50 %v p99 %v", r.Impl, r.HandoffP50MS, r.HandoffP99MS)
		}
		if r.CycleP50MS != nil {
			t.Errorf("%s: cycle_p50_ms set on a 2-contender row", r.Impl)
		}
		if (r.OfFloor == nil) != (r.Impl == ImplFloor) {
			t.Errorf("%s: of_floor %v: want it on every row but the floor's", r.Impl, fp(r.OfFloor))
		}
		if r.Rounds != 3 || r.Nodes != 1 || r.BytesPerAcq == nil || *r.BytesPerAcq <= 0 {
			t.Errorf("%s: rounds %d nodes %d bytes/acq %v", r.Impl, r.Rounds, r.Nodes, fp(r.BytesPerAcq))
		}
	}
	// The floor's Unlock is one Put, its Lock a watch event: one unary
	// RPC per turn, give or take the turn at each window's end (counted by
	// its Lock's return, its Put after the window's last count).
	if fl := sum.Results[2]; fl.RPCs < int64(fl.Acquisitions-3) || fl.RPCs > int64(fl.Acquisitions+3) {
		t.Errorf("floor: %d RPCs for %d turns, want one each", fl.RPCs, fl.Acquisitions)
	}
	if q := sum.Ratios[0]; q.HoldfastOfFloor == nil || q.NativeOfFloor == nil {
		t.Errorf("ratio without of_floor: %+v", q)
	}
	if sum.Failed() {
		t.Errorf("summary failed: %+v", sum)
	}
}

func TestJainAndPercentile(t *testing.T) {
	if j := jain([]int{5, 5, 5, 5}); j == nil || *j != 1 {
		t.Errorf("even: %v", j)
	}
	if j := jain([]int{8, 0, 0, 0}); j == nil || *j != 0.25 {
		t.Errorf("one takes all: %v", j)
	}
	if j := jain([]int{0, 0}); j != nil {
		t.Errorf("nothing: %v", j)
	}
	ds := []time.Duration{4 * time.Millisecond, time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond}
	if p := percentile(ds, 0.5); p == nil || *p != 2 {
		t.Errorf("p50: %v", p)
	}
	if p := percentile(ds, 0.99); p == nil || *p != 4 {
		t.Errorf("p99: %v", p)
	}
	if p := percentile(nil, 0.5); p != nil {
		t.Errorf("empty: %v", p)
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	for _, o := range []Options{{Contenders: []int{0}}, {Duration: -1}, {LockDelays: []time.Duration{61 * time.Second}}, {Waiters: []int{0}}, {Waiters: []int{1024}}, {Rounds: -1}, {Rounds: 101}} {
		if _, err := Run(context.Background(), nil, ScenarioLock, o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if _, err := Run(context.Background(), nil, "nope", Options{}); err == nil {
		t.Error("unknown scenario: no error")
	}
}

// TestEtcdTakeoverShort runs one takeover per implementation on an etcd
// reached through its endpoints (the --endpoints path): the holder's lease
// is revoked while a waiter waits.
func TestEtcdTakeoverShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	cluster := etcdtest.Etcd(t)
	target, err := DialEtcd(cluster.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	sum, err := Run(context.Background(), target, ScenarioTakeover, Options{TTL: 3 * time.Second, Repeats: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkTakeover(t, sum, "etcd", 1)
}

// TestConsulShort runs a very short lock scenario and one takeover with
// lock-delay 0 per implementation on a real Consul agent. A missing Consul
// binary fails the test (see scripts/consul.sh).
func TestConsulShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Consul agent")
	}
	target, err := StartConsul()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	ctx := context.Background()
	sum, err := Run(ctx, target, ScenarioLock, Options{Contenders: []int{2}, Duration: 300 * time.Millisecond, Warmup: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Results) != 3 || len(sum.Ratios) != 1 {
		t.Fatalf("got %d results and %d ratios, want 3 and 1", len(sum.Results), len(sum.Ratios))
	}
	for i, r := range sum.Results {
		t.Logf("%s: %d acquisitions, fairness %v, rpcs/acq %v, of_floor %v", r.Impl, r.Acquisitions, fp(r.Fairness), fp(r.RPCsPerAcq), fp(r.OfFloor))
		if r.Violations != 0 || r.Errors != 0 || r.Acquisitions < 1 || r.RPCUnit != "http-request" || r.RPCsPerAcq == nil {
			t.Errorf("%+v", r)
		}
		if r.Impl != []string{ImplHoldfast, ImplNative, ImplFloor}[i] || (r.OfFloor == nil) != (r.Impl == ImplFloor) {
			t.Errorf("row %d: impl %s of_floor %v", i, r.Impl, fp(r.OfFloor))
		}
	}
	// The floor's turn is one PUT and one blocking GET that returns it,
	// give or take a request or two at each edge of the 3 windows.
	if fl := sum.Results[2]; fl.RPCs < int64(2*fl.Acquisitions-12) || fl.RPCs > int64(2*fl.Acquisitions+12) {
		t.Errorf("floor: %d requests for %d turns, want two each", fl.RPCs, fl.Acquisitions)
	}
	sum, err = Run(ctx, target, ScenarioTakeover, Options{LockDelays: []time.Duration{0}, Repeats: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkTakeover(t, sum, "consul", 1)
}

func checkTakeover(t *testing.T, sum Summary, backend string, reps int) {
	t.Helper()
	if len(sum.Results) != 2 || len(sum.Ratios) != 1 {
		t.Fatalf("got %d results and %d ratios, want 2 and 1", len(sum.Results), len(sum.Ratios))
	}
	for _, r := range sum.Results {
		t.Logf("%s %s: takeover %s ms, notice %s ms", backend, r.Impl, fp(r.TakeoverMS), fp(r.NoticeMS))
		if r.Backend != backend || r.Scenario != ScenarioTakeover || r.Violations != 0 || r.Errors != 0 {
			t.Errorf("%+v", r)
		}
		if r.Acquisitions != reps || len(r.TakeoverAll) != reps || r.TakeoverMS == nil || r.LockDelayMS == nil || *r.LockDelayMS != 0 {
			t.Errorf("%s: acquisitions %d takeovers %v lock-delay %v", r.Impl, r.Acquisitions, r.TakeoverAll, fp(r.LockDelayMS))
		}
		if r.NoticeMS == nil {
			t.Errorf("%s: the killed holder was never told", r.Impl)
		}
	}
}

// BenchmarkEtcdCycle shows the harness used from `go test -bench`: an
// uncontended lock+unlock cycle per implementation on an embedded etcd.
func BenchmarkEtcdCycle(b *testing.B) {
	target, err := StartEtcd()
	if err != nil {
		b.Fatal(err)
	}
	defer target.Close()
	ctx := context.Background()
	for _, impl := range target.Impls() {
		b.Run(impl.Name(), func(b *testing.B) {
			counter := new(Counter)
			c, err := impl.NewContender(ctx, ContenderConfig{Lock: "bench-cycle/" + impl.Name(), Counter: counter, TTL: 15 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			before := counter.Requests()
			for b.Loop() {
				h, err := c.Lock(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := h.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(counter.Requests()-before)/float64(b.N), "rpcs/op")
		})
	}
}

// TestEtcdNodes3 runs a quick lock row on an embedded 3-member etcd
// (--nodes 3): every row reports 3 nodes, with no violation or error.
func TestEtcdNodes3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member embedded etcd")
	}
	if _, err := StartEtcdNodes(0); !errors.Is(err, ErrUsage) {
		t.Errorf("0 nodes: %v, want ErrUsage", err)
	}
	target, err := StartEtcdNodes(3)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sum, err := Run(ctx, target, ScenarioLock, Options{Quick: true, Contenders: []int{2}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Results) != 3 || sum.Failed() {
		t.Fatalf("%d rows, failed %v: %+v", len(sum.Results), sum.Failed(), sum.Results)
	}
	for _, r := range sum.Results {
		if r.Nodes != 3 || r.Acquisitions == 0 {
			t.Errorf("%s: nodes %d, acquisitions %d", r.Impl, r.Nodes, r.Acquisitions)
		}
	}
}

// startTarget starts an embedded etcd (backend "etcd") or a Consul dev
// agent (anything else) and closes it when the test ends.
func startTarget(t *testing.T, backend string) Target {
	t.Helper()
	var target Target
	var err error
	if backend == "etcd" {
		target, err = StartEtcd()
	} else {
		target, err = StartConsul()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	return target
}
