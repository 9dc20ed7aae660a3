package consul

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// newSemaphore returns a Semaphore or fails the test.
func newSemaphore(t testing.TB, s *Session, name string, limit int) *Semaphore {
	t.Helper()
	m, err := NewSemaphore(s, name, limit)
	if err != nil {
		t.Fatalf("NewSemaphore(%q, %d): %v", name, limit, err)
	}
	return m
}

// semLock reads the semaphore's lock key: its limit and holders (nil if
// absent).
func semLock(t testing.TB, c *api.Client, name string) *semaphoreLock {
	t.Helper()
	pair, _, err := c.KV().Get(name+"/.lock", &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatal(err)
	}
	if pair == nil {
		return nil
	}
	st, err := decodeSemaphoreLock(pair.Value, 0)
	if err != nil {
		t.Fatalf("%s/.lock: %v", name, err)
	}
	l := &semaphoreLock{Limit: st.limit, Holders: map[string]bool{}}
	for h := range st.holders {
		l.Holders[h] = true
	}
	return l
}

func TestSemaphoreBasic(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 30*time.Second)
	var sems []*Semaphore
	for range 3 {
		sems = append(sems, newSemaphore(t, newSession(t, c), name, 2))
	}
	g0, err := sems[0].Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g1, err := sems[1].TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g1.Token() <= g0.Token() {
		t.Errorf("tokens %d then %d: want increasing", g0.Token(), g1.Token())
	}
	if l := semLock(t, c, name); l == nil || l.Limit != 2 || len(l.Holders) != 2 {
		t.Fatalf("lock key %+v, want limit 2 and 2 holders", l)
	}
	before := keys(t, c, name)
	if _, err := sems[2].TryLock(ctx); !errors.Is(err, holdfast.ErrLocked) {
		t.Fatalf("TryLock when full: %v, want ErrLocked", err)
	}
	if after := keys(t, c, name); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("TryLock when full wrote: keys %v, then %v", before, after)
	}
	got := make(chan *Grant)
	go func() {
		g, err := sems[2].Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- g
	}()
	select {
	case <-got:
		t.Fatal("third Lock got a permit while two of two were held")
	case <-time.After(300 * time.Millisecond):
	}
	if err := g0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var g2 *Grant
	select {
	case g2 = <-got:
	case <-time.After(3 * time.Second):
		t.Fatal("third Lock not admitted within 3 s of a release")
	}
	if g2 == nil {
		t.FailNow()
	}
	if g2.Token() <= g1.Token() {
		t.Errorf("token %d after %d", g2.Token(), g1.Token())
	}
	if g2.Key() != name+"/"+sems[2].p.s.ID() {
		t.Errorf("key %q", g2.Key())
	}
	for _, g := range []*Grant{g1, g2} {
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Fatalf("after every Unlock, keys left: %v", ks)
	}
}

// TestSemaphoreExclusion runs many contenders through a small limit and
// counts holders in-process: never more than the limit at once.
func TestSemaphoreExclusion(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	const limit, contenders, rounds = 3, 12, 15
	ctx := timeout(t, 60*time.Second)
	var now, peak atomic.Int64
	var wg sync.WaitGroup
	for range contenders {
		m := newSemaphore(t, newSession(t, c), name, limit)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				g, err := m.Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				n := now.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(2 * time.Millisecond)
				if l := semLock(t, c, name); l == nil || len(l.Holders) > limit {
					t.Errorf("lock key %+v", l)
				}
				now.Add(-1)
				if err := g.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > limit {
		t.Fatalf("%d holders at once, limit %d", p, limit)
	}
	t.Logf("peak %d holders of %d", peak.Load(), limit)
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}
