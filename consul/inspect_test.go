package consul_test

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
)

// consulLock starts `consul lock` against a with args, and stops it when
// the test ends.
func consulLock(t *testing.T, a *embedtest.ConsulAgent, args ...string) {
	t.Helper()
	bin, err := embedtest.ConsulBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"lock", "-http-addr=" + a.HTTPAddr}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// inspectUntil inspects name until ok accepts the state (20 s at most).
func inspectUntil(t *testing.T, a *embedtest.ConsulAgent, what, name string, ok func(*holdfast.State) bool) *holdfast.State {
	t.Helper()
	var st *holdfast.State
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		st, err = consul.Inspect(context.Background(), a.Client(t), name)
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
// itself, or Other lists a key (holdfast's queue and tail keys included).
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

func session(t *testing.T, a *embedtest.ConsulAgent, opts ...consul.SessionOption) *consul.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := consul.NewSession(ctx, a.Client(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestInspect: on one agent, a holdfast lock with a waiter that linked
// itself behind the holder (the queue's links and marks are not shown),
// then the handoff;
// a `consul lock` holder with a holdfast waiter; a semaphore shared with
// `consul lock -n`; an election; a free name; an invalid one.
func TestInspect(t *testing.T) {
	a := embedtest.Consul(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("lock", func(t *testing.T) {
		m1, _ := consul.NewMutex(session(t, a, consul.WithLockDelay(250*time.Millisecond)), "ins/lock")
		g, err := m1.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m2, _ := consul.NewMutex(session(t, a), "ins/lock")
		got := make(chan holdfast.Grant, 1)
		go func() {
			if g, err := m2.Lock(ctx); err == nil {
				got <- g
			}
		}()
		st := inspectUntil(t, a, "the waiter did not queue and link itself", "ins/lock", func(st *holdfast.State) bool {
			ks, _, _ := a.Client(t).KV().Keys("ins/lock/", "", nil)
			return len(st.Waiters) == 1 && slices.ContainsFunc(ks, func(k string) bool { return strings.Contains(k, "/next/") })
		})
		noInternal(t, st)
		if st.Kind != holdfast.KindLock || len(st.Holders) != 1 {
			t.Fatalf("state %+v, want a lock with a holder", st)
		}
		h, w := st.Holders[0], st.Waiters[0]
		if h.Key != "ins/lock/.lock" || h.Token != g.Token() || h.Origin != holdfast.OriginHoldfast || h.TTL != 15*time.Second || h.LockDelay != 250*time.Millisecond || h.Left != -1 || h.Value != nil {
			t.Errorf("holder %+v, want holdfast's, token %d, TTL 15s, lock-delay 250ms", h, g.Token())
		}
		if w.Origin != holdfast.OriginHoldfast || !strings.HasSuffix(w.Key, "/"+w.Session) || w.Token != 0 {
			t.Errorf("waiter %+v", w)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		g2 := <-got
		st = inspectUntil(t, a, "the handoff", "ins/lock", func(st *holdfast.State) bool { return len(st.Waiters) == 0 })
		noInternal(t, st)
		if len(st.Holders) != 1 || st.Holders[0].Token != g2.Token() || st.Holders[0].Session != w.Session {
			t.Errorf("after the handoff: %+v, want the waiter holding with token %d", st, g2.Token())
		}
		_ = g2.Unlock(ctx)
	})

	t.Run("consul lock", func(t *testing.T) {
		consulLock(t, a, "ins/native", "sleep 30")
		inspectUntil(t, a, "consul lock did not take the lock", "ins/native", func(st *holdfast.State) bool { return len(st.Holders) == 1 })
		m, _ := consul.NewMutex(session(t, a), "ins/native")
		go func() { _, _ = m.Lock(ctx) }()
		st := inspectUntil(t, a, "the holdfast waiter did not queue", "ins/native", func(st *holdfast.State) bool { return len(st.Waiters) == 1 })
		noInternal(t, st)
		h := st.Holders[0]
		if st.Kind != holdfast.KindLock || h.Origin != holdfast.OriginNative || h.Value != nil || h.Token == 0 || h.TTL != 15*time.Second || h.LockDelay != 15*time.Second {
			t.Errorf("state %+v, holder %+v: want consul lock's (native, TTL 15s, lock-delay 15s)", st, h)
		}
		if st.Waiters[0].Origin != holdfast.OriginHoldfast {
			t.Errorf("waiter %+v, want holdfast's", st.Waiters[0])
		}
	})

	t.Run("semaphore", func(t *testing.T) {
		sem, _ := consul.NewSemaphore(session(t, a), "ins/sem", 2)
		g, err := sem.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		consulLock(t, a, "-n", "2", "ins/sem", "sleep 30")
		inspectUntil(t, a, "consul lock -n 2 did not get a permit", "ins/sem", func(st *holdfast.State) bool { return len(st.Holders) == 2 })
		sem3, _ := consul.NewSemaphore(session(t, a), "ins/sem", 2)
		go func() { _, _ = sem3.Lock(ctx) }()
		st := inspectUntil(t, a, "the holdfast waiter did not queue", "ins/sem", func(st *holdfast.State) bool { return len(st.Waiters) == 1 })
		noInternal(t, st)
		if st.Kind != holdfast.KindSemaphore || st.Limit != 2 {
			t.Fatalf("state %+v, want a semaphore of limit 2", st)
		}
		h0, h1, w := st.Holders[0], st.Holders[1], st.Waiters[0]
		if h0.Token != g.Token() || h0.Origin != holdfast.OriginHoldfast || h1.Origin != holdfast.OriginNative || h1.Token != 0 || w.Origin != holdfast.OriginHoldfast {
			t.Errorf("holders %+v, %+v, waiter %+v: want holdfast's (token %d), consul lock's, holdfast's", h0, h1, w, g.Token())
		}
	})

	t.Run("election", func(t *testing.T) {
		e1, _ := consul.NewElection(session(t, a), "ins/el")
		g, err := e1.Campaign(ctx, []byte("first"))
		if err != nil {
			t.Fatal(err)
		}
		e2, _ := consul.NewElection(session(t, a), "ins/el")
		go func() { _, _ = e2.Campaign(ctx, []byte("second")) }()
		st := inspectUntil(t, a, "the candidate did not queue", "ins/el", func(st *holdfast.State) bool { return len(st.Waiters) == 1 })
		noInternal(t, st)
		if st.Kind != holdfast.KindElection || len(st.Holders) != 1 || string(st.Holders[0].Value) != "first" || st.Holders[0].Token != g.Token() {
			t.Errorf("state %+v, want an election led by first, term %d", st, g.Token())
		}
	})

	if st, err := consul.Inspect(ctx, a.Client(t), "ins/free"); err != nil || st.Kind != holdfast.KindUnknown || len(st.Holders)+len(st.Waiters) != 0 {
		t.Errorf("free name: %+v, %v", st, err)
	}
	if _, err := consul.Inspect(ctx, a.Client(t), "a//b"); !errors.Is(err, holdfast.ErrInvalidName) {
		t.Errorf("invalid name: %v, want ErrInvalidName", err)
	}
}

// TestInspectBounded: with the agent frozen, Inspect returns within
// milliseconds of its context's end, with the context's error.
func TestInspectBounded(t *testing.T) {
	a := embedtest.Consul(t)
	proxy := embedtest.StartProxy(t, a.HTTPAddr)
	cli, err := api.NewClient(&api.Config{Address: proxy.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := consul.Inspect(context.Background(), cli, "ins/frozen"); err != nil {
		t.Fatal(err)
	}
	proxy.Pause()
	defer proxy.Mend()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = consul.Inspect(ctx, cli, "ins/frozen")
	if d := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || d > 300*time.Millisecond {
		t.Errorf("Inspect with Consul frozen: %v after %v, want the deadline's error within 300 ms", err, d)
	}
}
