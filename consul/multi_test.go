package consul

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// TestMultiMutexFencedCounters: 8 sessions lock random subsets (2 to 4) of 6
// names, passed in random order, for 10 s; each acquisition reads a counter
// per name and writes every counter + 1 in one guarded MultiGrant.Txn
// (check-session on every lock key). No acquisition deadlocks (each
// completes within its 30 s deadline), and each name's counter equals the
// number of acquisitions that included it.
func TestMultiMutexFencedCounters(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	base := uniqueName(t)
	const clients, nNames = 8, 6
	run := 10 * time.Second
	if testing.Short() {
		run = 3 * time.Second
	}
	if d, err := time.ParseDuration(os.Getenv("HOLDFAST_MULTI_RUN")); err == nil && d > 0 {
		run = d // a longer run by hand: HOLDFAST_MULTI_RUN=1m
	}
	names := make([]string, nNames)
	for i := range names {
		names[i] = fmt.Sprintf("%s/accounts/%d", base, i)
	}
	counter := func(n string) string { return base + "/counters/" + n }
	var (
		mu    sync.Mutex
		taken = map[string]int{}
		count = make([]int, clients)
		errs  []error
		wg    sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	end := time.Now().Add(run)
	for i := range clients {
		s := newSession(t, a.Client(t), WithLockDelay(0))
		wg.Go(func() {
			for time.Now().Before(end) {
				set := slices.Clone(names)
				rand.Shuffle(len(set), func(a, b int) { set[a], set[b] = set[b], set[a] })
				set = set[:2+rand.IntN(3)]
				m, err := NewMultiMutex(s, set...)
				if err != nil {
					fail(err)
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				g, err := m.Lock(ctx)
				if err != nil {
					cancel()
					fail(fmt.Errorf("client %d: Lock %v: %w", i, set, err))
					return
				}
				ops := make(api.TxnOps, 0, len(set))
				for _, n := range set {
					pair, _, err := s.Client().KV().Get(counter(n), (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
					if err != nil {
						fail(err)
						break
					}
					v := 0
					if pair != nil {
						v, _ = strconv.Atoi(string(pair.Value))
					}
					ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVSet, Key: counter(n), Value: []byte(strconv.Itoa(v + 1))}})
				}
				if _, err := g.Txn(ctx, ops); err != nil {
					fail(fmt.Errorf("client %d: guarded Txn on %v: %w", i, set, err))
				} else {
					mu.Lock()
					for _, n := range set {
						taken[n]++
					}
					count[i]++
					mu.Unlock()
				}
				if err := g.Unlock(ctx); err != nil {
					fail(fmt.Errorf("client %d: Unlock: %w", i, err))
				}
				cancel()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range names {
		got, _ := strconv.Atoi(value(t, admin, counter(n)))
		if got != taken[n] {
			t.Errorf("counter of %s = %d, want %d (acquisitions that included it)", n, got, taken[n])
		}
	}
	for i, n := range count {
		total += n
		if n == 0 {
			t.Errorf("client %d never acquired", i)
		}
	}
	t.Logf("%d acquisitions of 2-4 of %d names by %d sessions in %v, per client %v", total, nNames, clients, run, count)
	waitFor(t, 5*time.Second, "lock keys removed", func() bool { return len(keys(t, admin, base+"/accounts")) == 0 })
}

// TestMultiGuardedTxn: the guarded transaction checks every part's session:
// once one part's lock key is deleted from outside (before the session's
// key check can notice), the Txn fails with ErrNotHeld, applies nothing,
// and the multi-grant's context ends.
func TestMultiGuardedTxn(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	base := uniqueName(t)
	data := base + "-data"
	t.Cleanup(func() { _, _ = admin.KV().Delete(data, nil) })
	s := newSession(t, a.Client(t), WithLockDelay(0), WithTTL(30*time.Second))
	m, err := NewMultiMutex(s, base+"/b", base+"/a")
	if err != nil {
		t.Fatal(err)
	}
	ctx := timeout(t, 20*time.Second)
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Txn(ctx, api.TxnOps{setOp(data, "v1")}); err != nil {
		t.Fatalf("Txn while held: %v", err)
	}
	if _, err := g.Txn(ctx, api.TxnOps{setOp(base+"/a/.lock", "x")}); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Txn touching a part's keys: %v, want ErrInvalidArgument", err)
	}
	if g.Key(base+"/b") != base+"/b/.lock" || g.Token(base+"/b") <= g.Token(base+"/a") {
		t.Errorf("key of b %q, tokens a=%d b=%d: want b/.lock and b > a (taken in order)", g.Key(base+"/b"), g.Token(base+"/a"), g.Token(base+"/b"))
	}
	// The last part in canonical order: each part's check counts.
	if _, err := admin.KV().Delete(g.Key(base+"/b"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Txn(ctx, api.TxnOps{setOp(data, "stale")}); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("Txn after b's lock key was deleted: %v, want ErrNotHeld", err)
	}
	if v := value(t, admin, data); v != "v1" {
		t.Errorf("data = %q after the failed guarded write, want v1", v)
	}
	if g.Context().Err() == nil {
		t.Error("multi-grant context live after a failed guard")
	}
	_ = g.Unlock(ctx)
	waitFor(t, 5*time.Second, "lock keys removed", func() bool { return len(keys(t, admin, base)) == 0 })
}
