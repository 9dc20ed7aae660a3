package etcd_test

import (
	"context"
	"errors"
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

// TestCounterUnderLeaderLoss runs four workers that increment a counter in
// etcd under the lock (read, then a guarded write of value+1) while the
// cluster's leader is stopped and restarted again and again. Whatever
// errors the faults cause, no guarded write may be lost or doubled: the
// counter ends equal to the number of successful guarded writes, the values
// written are exactly 1..n, and fencing tokens increase with them.
func TestCounterUnderLeaderLoss(t *testing.T) {
	t.Parallel() // its own etcd, and mostly waiting: beside the other long tests
	c := etcdtest.EtcdCluster(t, 3)
	const (
		workers = 4
		run     = 8 * time.Second
		counter = "chaos/counter"
	)
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()

	type write struct {
		value int
		token holdfast.Token
	}
	var (
		mu     sync.Mutex
		writes []write
		fails  = map[string]int{}
		wg     sync.WaitGroup
	)
	fail := func(what string) { mu.Lock(); fails[what]++; mu.Unlock() }
	for range workers {
		s := newSession(t, c, etcd.WithTTL(3*time.Second))
		m := newMutex(t, s, "chaos/lock")
		cli := s.Client()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && s.Err() == nil {
				lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
				g, err := m.Lock(lctx)
				lcancel()
				if err != nil {
					fail("lock")
					continue
				}
				resp, err := cli.Get(ctx, counter)
				if err == nil {
					n := 0
					if len(resp.Kvs) == 1 {
						n, _ = strconv.Atoi(string(resp.Kvs[0].Value))
					}
					_, err = g.Txn(ctx, clientv3.OpPut(counter, strconv.Itoa(n+1)))
					if err == nil {
						mu.Lock()
						writes = append(writes, write{n + 1, g.Token()})
						mu.Unlock()
					} else if errors.Is(err, holdfast.ErrNotHeld) {
						fail("guard refused")
					} else {
						fail("txn error")
					}
				} else {
					fail("read")
				}
				uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := g.Unlock(uctx); err != nil {
					fail("unlock")
				}
				ucancel()
			}
		}()
	}
	// Faults: stop the leader, restart it a second later, repeat.
	for ctx.Err() == nil {
		time.Sleep(1500 * time.Millisecond)
		leader := c.Leader()
		if leader < 0 {
			continue
		}
		if err := c.Stop(leader); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if err := c.Restart(leader); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()

	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	resp, err := c.Client(t).Get(rctx, counter)
	if err != nil {
		t.Fatal(err)
	}
	final := 0
	if len(resp.Kvs) == 1 {
		final, _ = strconv.Atoi(string(resp.Kvs[0].Value))
	}
	// A Txn whose answer was lost to a fault may still have committed; it is
	// then missing from writes but present in the counter. Nothing else may
	// differ.
	slices.SortFunc(writes, func(a, b write) int { return a.value - b.value })
	for i, w := range writes {
		if i > 0 && w.value == writes[i-1].value {
			t.Fatalf("value %d written twice: two holders read the same counter", w.value)
		}
		if i > 0 && w.token < writes[i-1].token {
			t.Fatalf("token regressed: value %d token %d after value %d token %d", w.value, w.token, writes[i-1].value, writes[i-1].token)
		}
	}
	if len(writes) == 0 || final < len(writes) || final-len(writes) > fails["txn error"] {
		t.Fatalf("counter %d after %d acknowledged writes (%d txn errors)", final, len(writes), fails["txn error"])
	}
	// The values written are exactly 1..final: every acknowledged value lies
	// in that range (no duplicates, checked above), and the values missing
	// from it are no more than the writes whose answer was lost.
	for _, w := range writes {
		if w.value < 1 || w.value > final {
			t.Fatalf("value %d written, outside 1..%d", w.value, final)
		}
	}
	t.Logf("counter %d, %d acknowledged guarded writes, failures %v", final, len(writes), fails)
}
