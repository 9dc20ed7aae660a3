package bench

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// runManyShort runs many-locks with 200 locks on t and checks the rows'
// structure and the promises that do not depend on timing: nothing lost,
// no error, no goroutine per held grant, renewal traffic that does not grow
// with the number of held locks, and no key left behind.
func runManyShort(t *testing.T, target Target, opts ManyLocksOptions, impls []string) []ManyLocksResult {
	t.Helper()
	var streamed []ManyLocksResult
	var log strings.Builder
	opts.Log = &log
	opts.OnResult = func(r ManyLocksResult) { streamed = append(streamed, r) }
	var onHeld []int
	opts.OnHeld = func(r ManyLocksResult) {
		if r.HeapBytesPerGrant == nil || r.ReleaseAllS != nil {
			t.Errorf("OnHeld called with heap %s and release %s: want measured, not yet released", fp(r.HeapBytesPerGrant), fp(r.ReleaseAllS))
		}
		onHeld = append(onHeld, r.Locks)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rows, err := RunManyLocks(ctx, target, opts)
	if err != nil {
		t.Fatalf("RunManyLocks: %v\n%s", err, log.String())
	}
	if len(rows) != 2*len(impls) || len(streamed) != len(rows) {
		t.Fatalf("got %d rows (%d streamed), want %d", len(rows), len(streamed), 2*len(impls))
	}
	if len(onHeld) != len(impls) {
		t.Errorf("OnHeld called for %v, want once per implementation", onHeld)
	}
	for i, r := range rows {
		b, _ := json.Marshal(r)
		t.Log(string(b))
		impl, locks := impls[i/2], []int{0, opts.Locks[0]}[i%2]
		if r.Scenario != ScenarioManyLocks || r.Backend != target.Backend() || r.Impl != impl || r.Locks != locks {
			t.Errorf("row %d: %s %s %s %d, want %s %s %s %d", i, r.Scenario, r.Backend, r.Impl, r.Locks,
				ScenarioManyLocks, target.Backend(), impl, locks)
		}
		if r.Lost != 0 || r.Errors != 0 {
			t.Errorf("row %d: lost %d errors %d (%s)", i, r.Lost, r.Errors, r.FirstError)
		}
		if r.WindowS < opts.Window.Seconds() {
			t.Errorf("row %d: window %v s, want at least %v", i, r.WindowS, opts.Window.Seconds())
		}
		if locks == 0 {
			if r.AcquireAllS != nil || r.HeapBytesPerGrant != nil || r.GoroutinesPerGrant != nil {
				t.Errorf("row %d (no lock): acquire/heap/goroutine figures set", i)
			}
			continue
		}
		if r.AcquireAllS == nil || *r.AcquireAllS <= 0 || r.ReleaseAllS == nil || *r.ReleaseAllS <= 0 {
			t.Errorf("row %d: acquire_all_s %s release_all_s %s", i, fp(r.AcquireAllS), fp(r.ReleaseAllS))
		}
		if r.HeapBytesPerGrant == nil || r.GoroutinesPerGrant == nil || r.GoroutinesDelta == nil {
			t.Fatalf("row %d: no heap or goroutine figures", i)
		}
		// A goroutine per grant would be 200 more.
		if *r.GoroutinesDelta > 10 {
			t.Errorf("row %d: %d more goroutines while holding %d locks, want none per grant", i, *r.GoroutinesDelta, locks)
		}
		// A renewal per grant would be 200 more per period.
		if base := rows[i-1]; r.Renews > base.Renews+2 {
			t.Errorf("row %d: %d renewals holding %d locks, %d holding none", i, r.Renews, locks, base.Renews)
		}
	}
	return rows
}

// TestManyLocksEtcdShort runs many-locks with 200 locks on an embedded etcd,
// holdfast and concurrency.Mutex.
func TestManyLocksEtcdShort(t *testing.T) {
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
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before+2 {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines left running (%d before):\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
	}()
	rows := runManyShort(t, target, ManyLocksOptions{Locks: []int{200}, TTL: 2 * time.Second, Window: 2 * time.Second, Native: true},
		[]string{ImplHoldfast, ImplNative})
	for i, r := range rows {
		// etcd: the session sends nothing but keepalives while it holds.
		if r.Requests != r.Renews {
			t.Errorf("row %d: %d requests, %d of them keepalives: want keepalives only", i, r.Requests, r.Renews)
		}
		if r.Renews < 1 {
			t.Errorf("row %d: no keepalive in %v s at TTL 2 s", i, r.WindowS)
		}
		if r.Locks > 0 && r.ServerBytesPerLock == nil {
			t.Errorf("row %d: no server_bytes_per_lock on an embedded etcd", i)
		}
	}
	resp, err := target.admin.Get(context.Background(), "holdfast-bench/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Errorf("%d keys left under holdfast-bench/", resp.Count)
	}
}

// TestManyLocksConsulShort runs many-locks with 200 locks on a real Consul
// agent. A missing Consul binary fails the test (see scripts/consul.sh).
func TestManyLocksConsulShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Consul agent")
	}
	target, err := StartConsul()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	rows := runManyShort(t, target, ManyLocksOptions{Locks: []int{200}, TTL: 10 * time.Second, Window: 4 * time.Second},
		[]string{ImplHoldfast})
	if rows[1].ServerBytesPerLock != nil {
		t.Errorf("server_bytes_per_lock %v on Consul, whose agent runs in its own process", *rows[1].ServerBytesPerLock)
	}
	keys, _, err := target.admin.KV().Keys("holdfast-bench/", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("%d keys left under holdfast-bench/: %v", len(keys), keys[:min(len(keys), 5)])
	}
}

func TestManyLocksOptionsValidate(t *testing.T) {
	for _, o := range []ManyLocksOptions{{Locks: []int{0}}, {Locks: []int{100_001}}, {Concurrency: 129}, {Window: -1}} {
		if err := o.Validate(); !errors.Is(err, ErrUsage) {
			t.Errorf("%+v: %v, want ErrUsage", o, err)
		}
	}
	if _, err := RunManyLocks(context.Background(), nil, ManyLocksOptions{}); !errors.Is(err, ErrUsage) {
		t.Errorf("nil target: %v, want ErrUsage", err)
	}
}
