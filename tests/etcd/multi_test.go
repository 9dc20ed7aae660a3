package etcd_test

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

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// TestMultiMutexFencedCounters: 8 sessions lock random subsets (2 to 4) of 6
// names, passed in random order, for 10 s (HOLDFAST_MULTI_RUN to change it); each acquisition reads a counter
// per name and writes every counter + 1 in one guarded MultiGrant.Txn. No
// acquisition deadlocks (each completes within its 30 s deadline), and each
// name's counter equals the number of acquisitions that included it: no
// two holders of a name ever overlapped (a lost update would show).
func TestMultiMutexFencedCounters(t *testing.T) {
	t.Parallel() // its own etcd, and mostly waiting: beside the other long tests
	c := etcdtest.Etcd(t)
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
		names[i] = fmt.Sprintf("accounts/%d", i)
	}
	counter := func(n string) string { return "counters/" + n }
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
		s := newSession(t, c)
		wg.Go(func() {
			for time.Now().Before(end) {
				set := slices.Clone(names)
				rand.Shuffle(len(set), func(a, b int) { set[a], set[b] = set[b], set[a] })
				set = set[:2+rand.IntN(3)]
				m, err := etcd.NewMultiMutex(s, set...)
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
				ops := make([]clientv3.Op, 0, len(set))
				for _, n := range set {
					resp, err := s.Client().Get(ctx, counter(n))
					if err != nil {
						fail(err)
						break
					}
					v := 0
					if len(resp.Kvs) > 0 {
						v, _ = strconv.Atoi(string(resp.Kvs[0].Value))
					}
					ops = append(ops, clientv3.OpPut(counter(n), strconv.Itoa(v+1)))
				}
				if _, err := g.Txn(ctx, ops...); err != nil {
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
	cli := c.Client(t)
	total := 0
	for _, n := range names {
		resp, err := cli.Get(context.Background(), counter(n))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		if len(resp.Kvs) > 0 {
			got, _ = strconv.Atoi(string(resp.Kvs[0].Value))
		}
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
	t.Logf("%d acquisitions of 2-4 of %d names by %d sessions in %v, per client %v, per name %v", total, nNames, clients, run, count, taken)
	if ks := keys(t, cli, "accounts/"); len(ks) != 0 {
		t.Errorf("keys left: %v", ks)
	}
}

// TestMultiGuardedTxn: the guarded Txn compares every part: with the
// session's connection paused (so that the grant's watch cannot notice), one
// part's key is deleted from outside; the Txn then fails with ErrNotHeld and
// writes nothing, and the multi-grant's context ends.
func TestMultiGuardedTxn(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	s, p := proxiedSession(t, c, etcd.WithTTL(10*time.Second))
	m, err := etcd.NewMultiMutex(s, "multi-txn/b", "multi-txn/a", "multi-txn/b")
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Names(); !slices.Equal(got, []string{"multi-txn/a", "multi-txn/b"}) {
		t.Errorf("Names() = %v, want sorted and deduplicated", got)
	}
	if _, err := g.Txn(ctx, clientv3.OpPut("multi-txn-data", "v1")); err != nil {
		t.Fatalf("Txn while held: %v", err)
	}
	if _, err := g.Txn(ctx, clientv3.OpPut("multi-txn/a/x", "v")); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Txn touching a part's keys: %v, want ErrInvalidArgument", err)
	}
	if g.Token("multi-txn/a") == 0 || g.Token("multi-txn/b") <= g.Token("multi-txn/a") || g.Token("other") != 0 {
		t.Errorf("tokens a=%d b=%d other=%d: want a > 0, b > a (taken in order), other 0", g.Token("multi-txn/a"), g.Token("multi-txn/b"), g.Token("other"))
	}
	for _, victim := range []string{"multi-txn/b"} { // the last part: each guard counts
		p.Pause()
		if _, err := cli.Delete(ctx, g.Key(victim)); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := g.Txn(ctx, clientv3.OpPut("multi-txn-data", "stale"))
			errc <- err
		}()
		time.Sleep(50 * time.Millisecond)
		p.Mend()
		if err := <-errc; !errors.Is(err, holdfast.ErrNotHeld) {
			t.Fatalf("Txn after %s's key was deleted: %v, want ErrNotHeld", victim, err)
		}
	}
	if resp, err := cli.Get(ctx, "multi-txn-data"); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" {
		t.Fatalf("data after the failed guarded write: %v %v, want v1", resp, err)
	}
	if g.Context().Err() == nil {
		t.Error("multi-grant context live after a failed guard")
	}
	_ = g.Unlock(ctx)
	waitFor(t, 5*time.Second, "keys removed", func() bool { return len(keys(t, cli, "multi-txn/")) == 0 })
}
