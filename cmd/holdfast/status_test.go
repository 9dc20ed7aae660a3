package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	hfconsul "github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

// statusJSON runs holdfast status --json once and decodes its answer.
func statusJSON(t *testing.T, args ...string) state {
	t.Helper()
	p := start(t, append([]string{"status", "--json"}, args...)...)
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("status: exit %d; stderr: %s", code, p.stderr.String())
	}
	var st state
	if err := json.Unmarshal(p.stdout.Bytes(), &st); err != nil {
		t.Fatalf("status --json printed %q: %v", p.stdout.String(), err)
	}
	return st
}

// TestStatusEtcd: status lists the holder and the waiters in queue order,
// a native concurrency.Mutex waiter included, with tokens and lease TTLs;
// --watch prints the new state when the holder releases.
func TestStatusEtcd(t *testing.T) {
	e := embedtest.Etcd(t)
	ep := e.Endpoints()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	newMutex := func() *hfetcd.Mutex {
		s, err := hfetcd.NewSession(ctx, e.Client(t), hfetcd.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		m, err := hfetcd.NewMutex(s, "st/lock")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	holder, err := newMutex().Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() { // a holdfast waiter, then a native one
		g, err := newMutex().Lock(ctx)
		if err == nil {
			defer g.Unlock(context.Background())
		}
		<-ctx.Done()
	}()
	eventually(t, 10*time.Second, "the holdfast waiter did not queue", func() bool { return len(keysUnder(t, e.Client(t), "st/lock/")) == 2 })
	ns, err := concurrency.NewSession(e.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	go func() { _ = concurrency.NewMutex(ns, "st/lock").Lock(ctx) }()
	eventually(t, 10*time.Second, "the native waiter did not queue", func() bool { return len(keysUnder(t, e.Client(t), "st/lock/")) == 3 })

	st := statusJSON(t, "--endpoints", ep, "st/lock")
	if st.Kind != "lock" || len(st.Entries) != 3 {
		t.Fatalf("status: %+v, want a lock with 3 contenders", st)
	}
	for i, want := range []string{"holder", "waiter", "waiter"} {
		ttl := int64(10) // holdfast's sessions here; concurrency's default is 60 s
		if i == 2 {
			ttl = 60
		}
		if got := st.Entries[i]; got.Role != want || got.Position != i || got.TTLLeft == nil || *got.TTLLeft <= 0 || *got.TTLLeft > ttl {
			t.Errorf("entry %d: %+v, want a %s with a TTL left in (0, %d] s", i, got, want, ttl)
		}
	}
	if st.Entries[0].Key != holder.Key() || st.Entries[0].Token != uint64(holder.Token()) {
		t.Errorf("holder %+v, want key %s token %d", st.Entries[0], holder.Key(), holder.Token())
	}
	if !strings.HasPrefix(st.Entries[2].Key, "st/lock/") || st.Entries[2].Key != "st/lock/"+strings.TrimPrefix(st.Entries[2].Session, "lease ") {
		t.Errorf("native waiter %+v: want its key named by its lease", st.Entries[2])
	}

	// The table names the roles.
	p := start(t, "status", "--endpoints", ep, "st/lock")
	if code := p.wait(t, 30*time.Second); code != 0 || !strings.Contains(p.stdout.String(), "holder") || !strings.Contains(p.stdout.String(), "3 contender(s)") {
		t.Errorf("status table: exit %d:\n%s%s", code, p.stdout.String(), p.stderr.String())
	}

	// --watch prints again when the holder releases.
	cmd := exec.Command(holdfastBin(t), "status", "--json", "--watch", "--endpoints", ep, "st/lock")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	states := make(chan state, 8)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var s state
			if json.Unmarshal(sc.Bytes(), &s) == nil {
				states <- s
			}
		}
		close(states)
	}()
	next := func() state {
		select {
		case s := <-states:
			return s
		case <-time.After(20 * time.Second):
			t.Fatal("status --watch printed nothing new within 20 s")
			return state{}
		}
	}
	if first := next(); len(first.Entries) != 3 {
		t.Fatalf("first state %+v", first)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	second := next()
	if len(second.Entries) != 2 || second.Entries[0].Key != st.Entries[1].Key || second.Entries[0].Role != "holder" {
		t.Errorf("after the release: %+v, want the first waiter holding", second)
	}
}

// TestStatusConsul: the holder of a Consul lock, holdfast's or `consul
// lock`'s (marked as not holdfast), with its session's TTL and lock-delay,
// and the holdfast waiters in queue order.
func TestStatusConsul(t *testing.T) {
	a := embedtest.Consul(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	newMutex := func() *hfconsul.Mutex {
		s, err := hfconsul.NewSession(ctx, a.Client(t), hfconsul.WithLockDelay(250*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		m, err := hfconsul.NewMutex(s, "st/lock")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	holder, err := newMutex().Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		if g, err := newMutex().Lock(ctx); err == nil {
			defer g.Unlock(context.Background())
		}
		<-ctx.Done()
	}()
	var st state
	eventually(t, 10*time.Second, "the waiter did not queue", func() bool {
		st = statusJSON(t, "--backend", "consul", "--addr", a.HTTPAddr, "st/lock")
		return len(st.Entries) == 2
	})
	h, w := st.Entries[0], st.Entries[1]
	if h.Role != "holder" || h.Token != uint64(holder.Token()) || h.Key != "st/lock/.lock" || h.TTL != "15s" || h.LockDelay != "250ms" || h.Native {
		t.Errorf("holder %+v, want token %d, TTL 15s, lock-delay 250ms, holdfast", h, holder.Token())
	}
	if w.Role != "waiter" || !strings.HasPrefix(w.Key, "st/lock/.queue/") {
		t.Errorf("waiter %+v", w)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// A `consul lock` holder.
	bin, err := embedtest.ConsulBinary()
	if err != nil {
		t.Fatal(err)
	}
	native := exec.Command(bin, "lock", "-http-addr="+a.HTTPAddr, "native/lock", "sleep 30")
	if err := native.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = native.Process.Kill(); _ = native.Wait() }()
	eventually(t, 20*time.Second, "consul lock did not take the lock", func() bool {
		st = statusJSON(t, "--backend", "consul", "--addr", a.HTTPAddr, "--kind", "lock", "native/lock")
		return len(st.Entries) == 1
	})
	if !st.Entries[0].Native || st.Entries[0].Role != "holder" {
		t.Errorf("consul lock's holder: %+v, want a holder marked as not holdfast", st.Entries[0])
	}
}

// TestStatusSemaphore: a semaphore shows its limit, every holder with its
// token, and the waiters in order, on etcd and on Consul (where a `consul
// lock -n` holder shows up as not holdfast).
func TestStatusSemaphore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t.Run("etcd", func(t *testing.T) {
		e := embedtest.Etcd(t)
		var tokens []uint64
		for i := range 3 {
			s, err := hfetcd.NewSession(ctx, e.Client(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			sem, err := hfetcd.NewSemaphore(s, "st/sem", 2)
			if err != nil {
				t.Fatal(err)
			}
			if i < 2 {
				g, err := sem.Lock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				tokens = append(tokens, uint64(g.Token()))
				continue
			}
			go func() { _, _ = sem.Lock(ctx) }()
		}
		eventually(t, 10*time.Second, "the waiter did not queue", func() bool { return len(keysUnder(t, e.Client(t), "st/sem/")) == 3 })
		st := statusJSON(t, "--endpoints", e.Endpoints()[0], "st/sem")
		if st.Kind != "semaphore" || st.Limit != 2 || len(st.Entries) != 3 {
			t.Fatalf("status %+v: want a semaphore with limit 2 and 3 contenders", st)
		}
		for i, want := range []string{"holder", "holder", "waiter"} {
			if st.Entries[i].Role != want || (i < 2 && st.Entries[i].Token != tokens[i]) {
				t.Errorf("entry %d: %+v, want a %s (tokens %v)", i, st.Entries[i], want, tokens)
			}
		}
	})
	t.Run("consul", func(t *testing.T) {
		a := embedtest.Consul(t)
		bin, err := embedtest.ConsulBinary()
		if err != nil {
			t.Fatal(err)
		}
		s, err := hfconsul.NewSession(ctx, a.Client(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		sem, err := hfconsul.NewSemaphore(s, "st/sem", 2)
		if err != nil {
			t.Fatal(err)
		}
		g, err := sem.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		native := exec.Command(bin, "lock", "-http-addr="+a.HTTPAddr, "-n", "2", "st/sem", "sleep 30")
		if err := native.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = native.Process.Kill(); _ = native.Wait() }()
		var st state
		eventually(t, 20*time.Second, "consul lock -n 2 did not get a permit", func() bool {
			st = statusJSON(t, "--backend", "consul", "--addr", a.HTTPAddr, "st/sem")
			return len(st.Entries) == 2
		})
		if st.Kind != "semaphore" || st.Limit != 2 {
			t.Fatalf("status %+v: want a semaphore with limit 2", st)
		}
		h0, h1 := st.Entries[0], st.Entries[1]
		if h0.Role != "holder" || h0.Token != uint64(g.Token()) || h0.Native || h1.Role != "holder" || !h1.Native {
			t.Errorf("holders %+v and %+v: want holdfast's (token %d), then consul lock's", h0, h1, g.Token())
		}
	})
}
