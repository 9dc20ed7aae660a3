package etcd_test

import (
	"context"
	"errors"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// etcdctl starts Debian's etcdctl (3.4) against c with args, and stops it
// when the test ends.
func etcdctl(t *testing.T, c *etcdtest.Cluster, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("etcdctl")
	if err != nil {
		t.Fatalf("etcdctl (Debian package etcd-client) is needed: %v", err)
	}
	cmd := exec.Command(bin, append([]string{"--endpoints", c.Endpoints()[0]}, args...)...)
	cmd.Env = append(cmd.Environ(), "ETCDCTL_API=3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// inspectUntil inspects name until ok accepts the state (10 s at most).
func inspectUntil(t *testing.T, c *etcdtest.Cluster, what, name string, ok func(*holdfast.State) bool) *holdfast.State {
	t.Helper()
	var st *holdfast.State
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		st, err = etcd.Inspect(context.Background(), c.Client(t), name)
		if err != nil {
			t.Fatal(err)
		}
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: last state %+v", what, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// noInternal fails if a contender shows a value that holdfast wrote for
// itself, or Other lists a key.
func noInternal(t *testing.T, st *holdfast.State) {
	t.Helper()
	for _, ct := range append(append([]holdfast.Contender{}, st.Holders...), st.Waiters...) {
		if strings.HasPrefix(string(ct.Value), "holdfast") {
			t.Errorf("%s shows holdfast's value %q as data", ct.Key, ct.Value)
		}
	}
	if len(st.Other) > 0 {
		t.Errorf("other keys shown: %q", st.Other)
	}
}

// TestInspectLock: a holdfast holder, then an `etcdctl lock` waiter and a
// holdfast waiter, in order, with tokens, leases, TTLs and origins; then
// etcdctl holding with a holdfast waiter.
func TestInspectLock(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s1 := newSession(t, c, etcd.WithTTL(10*time.Second))
	g, err := newMutex(t, s1, "ins/lock").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	etcdctl(t, c, "lock", "ins/lock", "sleep", "30")
	inspectUntil(t, c, "etcdctl lock did not queue", "ins/lock", func(st *holdfast.State) bool { return len(st.Waiters) == 1 })
	s2 := newSession(t, c, etcd.WithTTL(10*time.Second))
	go func() { _, _ = newMutex(t, s2, "ins/lock").Lock(ctx) }()
	st := inspectUntil(t, c, "the holdfast waiter did not queue", "ins/lock", func(st *holdfast.State) bool { return len(st.Waiters) == 2 })
	noInternal(t, st)
	if st.Kind != holdfast.KindLock || len(st.Holders) != 1 {
		t.Fatalf("state %+v, want a lock with one holder", st)
	}
	h, w0, w1 := st.Holders[0], st.Waiters[0], st.Waiters[1]
	if h.Key != g.Key() || h.Token != g.Token() || h.Origin != holdfast.OriginHoldfast || h.TTL != 10*time.Second || h.Left <= 0 || h.Left > 10*time.Second {
		t.Errorf("holder %+v, want key %s token %d, holdfast's, TTL 10s", h, g.Key(), g.Token())
	}
	if w0.Origin != holdfast.OriginNative || w0.TTL != 10*time.Second || w0.Token != 0 || w0.Key != "ins/lock/"+w0.Session {
		t.Errorf("first waiter %+v, want etcdctl's (native, its default TTL 10s, key named by its lease)", w0)
	}
	if w1.Origin != holdfast.OriginHoldfast || w1.Session != strings.TrimPrefix(w1.Key, "ins/lock/") {
		t.Errorf("second waiter %+v, want holdfast's", w1)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	st = inspectUntil(t, c, "etcdctl did not take the lock", "ins/lock", func(st *holdfast.State) bool { return len(st.Waiters) == 1 })
	if h := st.Holders[0]; h.Origin != holdfast.OriginNative || h.Key != w0.Key || h.Token == 0 || h.Value != nil {
		t.Errorf("holder %+v, want etcdctl's, with a token", h)
	}
}

// TestInspectElection: an `etcdctl elect` leader, a holdfast candidate and
// another etcdctl candidate, in order, with the proposals as written.
func TestInspectElection(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	etcdctl(t, c, "elect", "ins/el", "first")
	inspectUntil(t, c, "etcdctl elect did not lead", "ins/el", func(st *holdfast.State) bool { return len(st.Holders) == 1 })
	e, err := etcd.NewElection(newSession(t, c), "ins/el")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = e.Campaign(ctx, []byte("mine")) }()
	inspectUntil(t, c, "the holdfast candidate did not queue", "ins/el", func(st *holdfast.State) bool { return len(st.Waiters) == 1 })
	etcdctl(t, c, "elect", "ins/el", "third")
	st := inspectUntil(t, c, "the second etcdctl did not queue", "ins/el", func(st *holdfast.State) bool { return len(st.Waiters) == 2 })
	noInternal(t, st)
	if st.Kind != holdfast.KindElection || len(st.Holders) != 1 {
		t.Fatalf("state %+v, want an election with a leader", st)
	}
	if h := st.Holders[0]; string(h.Value) != "first" || h.Token == 0 || h.Origin != holdfast.OriginUnknown {
		t.Errorf("leader %+v, want value first, a term, origin unknown", h)
	}
	if w := st.Waiters[0]; w.Value != nil || w.Origin != holdfast.OriginHoldfast {
		t.Errorf("first candidate %+v, want holdfast's (no value until it takes office)", w)
	}
	if w := st.Waiters[1]; string(w.Value) != "third" || w.Origin != holdfast.OriginNative {
		t.Errorf("second candidate %+v, want etcdctl's with value third", w)
	}
}

// TestInspectSemaphoreRW: a semaphore's limit, holders and waiter; a
// read-write lock's reader holders and writer waiter with their modes; a
// free name; an invalid one.
func TestInspectSemaphoreRW(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var tokens []holdfast.Token
	for i := range 3 {
		sem, err := etcd.NewSemaphore(newSession(t, c), "ins/sem", 2)
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			go func() { _, _ = sem.Lock(ctx) }()
			continue
		}
		g, err := sem.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, g.Token())
	}
	st := inspectUntil(t, c, "the semaphore's waiter did not queue", "ins/sem", func(st *holdfast.State) bool { return len(st.Waiters) == 1 })
	noInternal(t, st)
	if st.Kind != holdfast.KindSemaphore || st.Limit != 2 || len(st.Holders) != 2 || st.Holders[0].Token != tokens[0] || st.Holders[1].Token != tokens[1] {
		t.Errorf("state %+v, want a semaphore of limit 2 with holders %v and a waiter", st, tokens)
	}

	for i := range 3 {
		rw, err := etcd.NewRWMutex(newSession(t, c), "ins/rw")
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			go func() { _, _ = rw.Lock(ctx) }()
			continue
		}
		if _, err := rw.RLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st = inspectUntil(t, c, "the writer did not queue", "ins/rw", func(st *holdfast.State) bool { return len(st.Waiters) == 1 })
	noInternal(t, st)
	if st.Kind != holdfast.KindRWMutex || len(st.Holders) != 2 || st.Holders[0].Mode != "read" || st.Holders[1].Mode != "read" || st.Waiters[0].Mode != "write" || st.Waiters[0].Origin != holdfast.OriginHoldfast {
		t.Errorf("state %+v, want two readers holding and a writer waiting", st)
	}

	if st, err := etcd.Inspect(ctx, c.Client(t), "ins/free"); err != nil || st.Kind != holdfast.KindUnknown || len(st.Holders)+len(st.Waiters) != 0 {
		t.Errorf("free name: %+v, %v", st, err)
	}
	if _, err := etcd.Inspect(ctx, c.Client(t), "a//b"); !errors.Is(err, holdfast.ErrInvalidName) {
		t.Errorf("invalid name: %v, want ErrInvalidName", err)
	}
}

// TestInspectBounded: with the store frozen, Inspect returns within
// milliseconds of its context's end, with the context's error.
func TestInspectBounded(t *testing.T) {
	c := etcdtest.Etcd(t)
	u, err := url.Parse(c.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	proxy := embedtest.StartProxy(t, u.Host)
	cli := c.Client(t, func(cfg *clientv3.Config) { cfg.Endpoints = []string{proxy.URL()} })
	if _, err := etcd.Inspect(context.Background(), cli, "ins/frozen"); err != nil {
		t.Fatal(err)
	}
	proxy.Pause()
	defer proxy.Mend()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = etcd.Inspect(ctx, cli, "ins/frozen")
	if d := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || d > 300*time.Millisecond {
		t.Errorf("Inspect with etcd frozen: %v after %v, want the deadline's error within 300 ms", err, d)
	}
}
