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
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

// statusJSON runs holdfast status --json once and decodes its answer.
func statusJSON(t *testing.T, args ...string) view {
	t.Helper()
	p := start(t, append([]string{"status", "--json"}, args...)...)
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("status: exit %d; stderr: %s", code, p.stderr.String())
	}
	var st view
	if err := json.Unmarshal(p.stdout.Bytes(), &st); err != nil {
		t.Fatalf("status --json printed %q: %v", p.stdout.String(), err)
	}
	if out := p.stdout.String(); strings.Contains(out, "holdfast waiter") || strings.Contains(out, "/.tail") || strings.Contains(out, "holdfast held") || strings.Contains(out, "holdfast semaphore") || strings.Contains(out, `"holdfast lock"`) {
		t.Errorf("status shows holdfast's bookkeeping as data: %s", out)
	}
	return st
}

// contenders returns the holders, then the waiters.
func (v view) contenders() []contenderView {
	return append(append([]contenderView{}, v.Holders...), v.Waiters...)
}

// TestStatusEtcd: status lists the holder and the waiters in queue order,
// a native concurrency.Mutex waiter included, with tokens and lease TTLs;
// --watch prints the new state when the holder releases.
func TestStatusEtcd(t *testing.T) {
	e := etcdtest.Etcd(t)
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
	if st.Kind != "lock" || len(st.Holders) != 1 || len(st.Waiters) != 2 {
		t.Fatalf("status: %+v, want a lock with a holder and 2 waiters", st)
	}
	for i, c := range st.contenders() {
		want, ttl, origin := "waiter", 10*time.Second, "holdfast" // holdfast's sessions here
		if i == 0 {
			want = "holder"
		}
		if i == 2 {
			ttl, origin = 60*time.Second, "native" // concurrency's default
		}
		left, err := time.ParseDuration(c.Left)
		if c.Role != want || err != nil || left <= 0 || left > ttl || c.TTL != ttl.String() || c.Origin != origin {
			t.Errorf("contender %d: %+v, want a %s with TTL %v, time left in (0, TTL], origin %s", i, c, want, ttl, origin)
		}
	}
	if h := st.Holders[0]; h.Key != holder.Key() || h.Token != uint64(holder.Token()) {
		t.Errorf("holder %+v, want key %s token %d", h, holder.Key(), holder.Token())
	}
	if w := st.Waiters[1]; w.Key != "st/lock/"+w.Session {
		t.Errorf("native waiter %+v: want its key named by its lease", w)
	}

	// The table names the roles.
	p := start(t, "status", "--endpoints", ep, "st/lock")
	if code := p.wait(t, 30*time.Second); code != 0 || !strings.Contains(p.stdout.String(), "holder") || !strings.Contains(p.stdout.String(), "1 holder(s), 2 waiter(s)") || !strings.Contains(p.stdout.String(), "native") {
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
	states := make(chan view, 8)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var s view
			if json.Unmarshal(sc.Bytes(), &s) == nil {
				states <- s
			}
		}
		close(states)
	}()
	next := func() view {
		select {
		case s := <-states:
			return s
		case <-time.After(20 * time.Second):
			t.Fatal("status --watch printed nothing new within 20 s")
			return view{}
		}
	}
	if first := next(); len(first.contenders()) != 3 {
		t.Fatalf("first state %+v", first)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	second := next()
	if len(second.Holders) != 1 || len(second.Waiters) != 1 || second.Holders[0].Key != st.Waiters[0].Key {
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
	var st view
	eventually(t, 10*time.Second, "the waiter did not queue", func() bool {
		st = statusJSON(t, "--backend", "consul", "--addr", a.HTTPAddr, "st/lock")
		return len(st.Waiters) == 1
	})
	if st.Kind != "lock" || len(st.Holders) != 1 || len(st.Other) != 0 {
		t.Fatalf("status %+v, want a lock with a holder, no other key", st)
	}
	h, w := st.Holders[0], st.Waiters[0]
	if h.Role != "holder" || h.Token != uint64(holder.Token()) || h.Key != "st/lock/.lock" || h.TTL != "15s" || h.LockDelay != "250ms" || h.Origin != "holdfast" || h.Value != "" {
		t.Errorf("holder %+v, want token %d, TTL 15s, lock-delay 250ms, holdfast", h, holder.Token())
	}
	if w.Role != "waiter" || !strings.HasPrefix(w.Key, "st/lock/.queue/") || w.Origin != "holdfast" {
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
		st = statusJSON(t, "--backend", "consul", "--addr", a.HTTPAddr, "native/lock")
		return len(st.Holders) == 1
	})
	if c := st.Holders[0]; st.Kind != "lock" || c.Origin != "native" || c.Value != "" || c.Token == 0 {
		t.Errorf("consul lock's holder: %+v in %+v, want a lock's holder marked native", c, st)
	}
}

// TestStatusSemaphore: a semaphore shows its limit, every holder with its
// token, and the waiters in order, on etcd and on Consul (where a `consul
// lock -n` holder shows up as not holdfast).
func TestStatusSemaphore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t.Run("etcd", func(t *testing.T) {
		e := etcdtest.Etcd(t)
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
		if st.Kind != "semaphore" || st.Limit != 2 || len(st.Holders) != 2 || len(st.Waiters) != 1 {
			t.Fatalf("status %+v: want a semaphore with limit 2, 2 holders and a waiter", st)
		}
		for i, c := range st.contenders() {
			if c.Origin != "holdfast" || (i < 2 && c.Token != tokens[i]) {
				t.Errorf("contender %d: %+v, want holdfast's (tokens %v)", i, c, tokens)
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
		var st view
		eventually(t, 20*time.Second, "consul lock -n 2 did not get a permit", func() bool {
			st = statusJSON(t, "--backend", "consul", "--addr", a.HTTPAddr, "st/sem")
			return len(st.Holders) == 2
		})
		if st.Kind != "semaphore" || st.Limit != 2 {
			t.Fatalf("status %+v: want a semaphore with limit 2", st)
		}
		h0, h1 := st.Holders[0], st.Holders[1]
		if h0.Token != uint64(g.Token()) || h0.Origin != "holdfast" || h1.Origin != "native" {
			t.Errorf("holders %+v and %+v: want holdfast's (token %d), then consul lock's", h0, h1, g.Token())
		}
	})
}

// TestStatusNativeHolders: status --json against etcdctl lock and etcdctl
// elect holders (etcd 3.4's etcdctl) and consul lock and consul lock -n
// holders, each with holdfast contenders queued behind: the kind, the
// holders and the waiters in order, the native ones marked, no internal
// key or tag shown as data (statusJSON checks the output for them).
func TestStatusNativeHolders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	background := func(t *testing.T, bin string, env []string, args ...string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(cmd.Environ(), env...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	t.Run("etcd", func(t *testing.T) {
		e := etcdtest.Etcd(t)
		ep := e.Endpoints()[0]
		etcdctl, err := exec.LookPath("etcdctl")
		if err != nil {
			t.Fatalf("etcdctl (Debian package etcd-client) is needed: %v", err)
		}
		api3 := []string{"ETCDCTL_API=3"}
		s, err := hfetcd.NewSession(ctx, e.Client(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })

		background(t, etcdctl, api3, "--endpoints", ep, "lock", "nat/lock", "sleep", "60")
		var st view
		eventually(t, 10*time.Second, "etcdctl lock did not hold", func() bool {
			st = statusJSON(t, "--endpoints", ep, "nat/lock")
			return len(st.Holders) == 1
		})
		m, _ := hfetcd.NewMutex(s, "nat/lock")
		go func() { _, _ = m.Lock(ctx) }()
		eventually(t, 10*time.Second, "the holdfast waiter did not queue", func() bool {
			st = statusJSON(t, "--endpoints", ep, "nat/lock")
			return len(st.Waiters) == 1
		})
		if h, w := st.Holders[0], st.Waiters[0]; st.Kind != "lock" || h.Origin != "native" || h.Token == 0 || h.Value != "" || w.Origin != "holdfast" || len(st.Other) != 0 {
			t.Errorf("etcdctl lock: %+v, want a lock held by a native holder, a holdfast waiter", st)
		}

		background(t, etcdctl, api3, "--endpoints", ep, "elect", "nat/el", "alpha")
		eventually(t, 10*time.Second, "etcdctl elect did not lead", func() bool {
			st = statusJSON(t, "--endpoints", ep, "nat/el")
			return len(st.Holders) == 1
		})
		el, _ := hfetcd.NewElection(s, "nat/el")
		go func() { _, _ = el.Campaign(ctx, []byte("beta")) }()
		eventually(t, 10*time.Second, "the holdfast candidate did not queue", func() bool {
			st = statusJSON(t, "--endpoints", ep, "nat/el")
			return len(st.Waiters) == 1
		})
		background(t, etcdctl, api3, "--endpoints", ep, "elect", "nat/el", "gamma")
		eventually(t, 10*time.Second, "the second etcdctl did not queue", func() bool {
			st = statusJSON(t, "--endpoints", ep, "nat/el")
			return len(st.Waiters) == 2
		})
		l, c1, c2 := st.Holders[0], st.Waiters[0], st.Waiters[1]
		if st.Kind != "election" || l.Role != "leader" || l.Value != "alpha" || l.Origin != "unknown" || c1.Role != "candidate" || c1.Origin != "holdfast" || c1.Value != "" || c2.Value != "gamma" || c2.Origin != "native" {
			t.Errorf("etcdctl elect: %+v, want leader alpha (origin unknown), holdfast's candidate, etcdctl's gamma", st)
		}
	})
	t.Run("consul", func(t *testing.T) {
		a := embedtest.Consul(t)
		bin, err := embedtest.ConsulBinary()
		if err != nil {
			t.Fatal(err)
		}
		addr := []string{"--backend", "consul", "--addr", a.HTTPAddr}
		newSession := func() *hfconsul.Session {
			s, err := hfconsul.NewSession(ctx, a.Client(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}

		background(t, bin, nil, "lock", "-http-addr="+a.HTTPAddr, "nat/lock", "sleep 60")
		var st view
		eventually(t, 20*time.Second, "consul lock did not hold", func() bool {
			st = statusJSON(t, append(addr, "nat/lock")...)
			return len(st.Holders) == 1
		})
		for range 2 {
			m, _ := hfconsul.NewMutex(newSession(), "nat/lock")
			go func() { _, _ = m.Lock(ctx) }()
		}
		eventually(t, 10*time.Second, "the holdfast waiters did not queue", func() bool {
			st = statusJSON(t, append(addr, "nat/lock")...)
			return len(st.Waiters) == 2
		})
		if h := st.Holders[0]; st.Kind != "lock" || h.Origin != "native" || h.Key != "nat/lock/.lock" || h.LockDelay != "15s" || st.Waiters[0].Origin != "holdfast" || st.Waiters[1].Origin != "holdfast" || len(st.Other) != 0 {
			t.Errorf("consul lock: %+v, want a lock held by a native holder, two holdfast waiters, no other key", st)
		}

		var gs []*hfconsul.Grant
		for range 2 {
			sem, _ := hfconsul.NewSemaphore(newSession(), "nat/sem", 2)
			g, err := sem.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			gs = append(gs, g)
		}
		background(t, bin, nil, "lock", "-http-addr="+a.HTTPAddr, "-n", "2", "nat/sem", "sleep 60")
		eventually(t, 20*time.Second, "consul lock -n 2 did not queue", func() bool {
			st = statusJSON(t, append(addr, "nat/sem")...)
			return len(st.Waiters) == 1
		})
		if h, w := st.Holders[0], st.Waiters[0]; st.Kind != "semaphore" || st.Limit != 2 || len(st.Holders) != 2 || h.Origin != "holdfast" || h.Token != uint64(gs[0].Token()) || w.Origin != "native" || len(st.Other) != 0 {
			t.Errorf("consul lock -n: %+v, want a semaphore of limit 2 held by holdfast (first token %d), consul lock -n waiting, marked native", st, gs[0].Token())
		}
		if err := gs[0].Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "consul lock -n 2 did not take the permit", func() bool {
			st = statusJSON(t, append(addr, "nat/sem")...)
			return len(st.Holders) == 2 && len(st.Waiters) == 0 && st.Holders[1].Origin == "native"
		})
	})
}

// TestStatusFlags: status lists and takes only the flags it uses; the
// session's flags (--ttl, --lock-delay) are unknown to it (exit 2).
func TestStatusFlags(t *testing.T) {
	p := start(t, "status", "--help")
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("status --help: exit %d", code)
	}
	help := p.stdout.String() + p.stderr.String()
	for _, f := range []string{"--ttl", "--lock-delay"} {
		if strings.Contains(help, f) {
			t.Errorf("status --help lists %s:\n%s", f, help)
		}
	}
	for _, f := range []string{"--kind", "--json", "--watch", "--endpoints", "--addr", "--backend"} {
		if !strings.Contains(help, f) {
			t.Errorf("status --help lacks %s", f)
		}
	}
	for _, args := range [][]string{{"--ttl", "5s"}, {"--lock-delay", "0"}} {
		p := start(t, append(append([]string{"status"}, args...), "x")...)
		if code := p.wait(t, 10*time.Second); code != 2 || !strings.Contains(p.stderr.String(), "unknown flag") {
			t.Errorf("status %v x: exit %d, stderr %q; want 2, unknown flag", args, code, p.stderr.String())
		}
	}
}

// TestObserveNoSession: elect --observe reads the election without a
// session of its own: while it watches a leader come and go, etcd has only
// the candidate's lease and Consul only the candidate's session (before,
// the observer granted a lease and created a session of its own).
func TestObserveNoSession(t *testing.T) {
	e := etcdtest.Etcd(t)
	a := embedtest.Consul(t)
	for _, st := range []struct {
		name     string
		flags    []string
		sessions func() int
	}{
		{"etcd", []string{"--endpoints", e.Endpoints()[0]}, func() int {
			l, err := e.Client(t).Leases(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return len(l.Leases)
		}},
		{"consul", []string{"--backend", "consul", "--addr", a.HTTPAddr}, func() int {
			l, _, err := a.Client(t).Session().List(nil)
			if err != nil {
				t.Fatal(err)
			}
			return len(l)
		}},
	} {
		t.Run(st.name, func(t *testing.T) {
			before := st.sessions()
			obs := observer(t, append(st.flags, "obs/none")...)
			if o := nextObservation(t, obs); !o.None {
				t.Fatalf("first observation %+v, want no leader", o)
			}
			if n := st.sessions(); n != before {
				t.Errorf("%d leases or sessions while observing, %d before: the observer opened one", n, before)
			}
			p := start(t, append(append([]string{"elect", "--value", "v1"}, st.flags...), "obs/none", "--", "sleep", "0.5")...)
			if o := nextObservation(t, obs); o.Value != "v1" {
				t.Fatalf("observation %+v, want v1 leading", o)
			}
			if n := st.sessions(); n != before+1 {
				t.Errorf("%d leases or sessions with a candidate, %d before: want only the candidate's", n, before)
			}
			if code := p.wait(t, 20*time.Second); code != 0 {
				t.Fatalf("elect: exit %d: %s", code, p.stderr.String())
			}
			if o := nextObservation(t, obs); !o.None {
				t.Fatalf("observation %+v after the leader resigned, want no leader", o)
			}
		})
	}
}
