package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	hfconsul "github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

func TestOnceUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"once", "jobs", "--", "true"}, "--every is required"},
		{[]string{"once", "--every", "1m", "jobs"}, "missing the command"},
		{[]string{"once", "--every", "1m", "--at-least", "2m", "jobs", "--", "true"}, "--at-least 2m0s is not shorter than --every"},
		{[]string{"once", "--every", "1m", "--at-most", "30s", "--at-least", "40s", "jobs", "--", "true"}, "--at-least 40s is longer than --at-most"},
		{[]string{"once", "--every", "1m", "--timeout", "-1s", "jobs", "--", "true"}, "--timeout -1s is negative"},
		{[]string{"once", "--every", "1m", "--log", "xml", "jobs", "--", "true"}, "--log"},
		{[]string{"once", "--every", "1m", "--claimed-exit", "300", "jobs", "--", "true"}, "0 to 255"},
		{[]string{"once", "--every", "1m", "/jobs", "--", "true"}, "invalid name"},
		// A period too short for any claim: refused before any request
		// (the addresses refuse connections), on both stores.
		{[]string{"once", "--every", "1ms", "--endpoints", "127.0.0.1:1", "jobs", "--", "true"}, "--every 1ms is shorter than 1s, the shortest period accepted"},
		{[]string{"once", "--every", "1ns", "--endpoints", "127.0.0.1:1", "jobs", "--", "true"}, "--every 1ns is shorter than 1s"},
		{[]string{"once", "--every", "999ms", "--backend", "consul", "--addr", "127.0.0.1:1", "jobs", "--", "true"}, "--every 999ms is shorter than 1s"},
		{[]string{"once", "--every", "1ns", "--backend", "consul", "--addr", "127.0.0.1:1", "jobs", "--", "true"}, "--every 1ns is shorter than 1s"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, tc.args)
		if got := stderr.String(); code != 2 || !strings.Contains(got, tc.want) {
			t.Errorf("holdfast %s: exit %d, want 2; stderr lacks %q:\n%s", strings.Join(tc.args, " "), code, tc.want, got)
		}
	}
}

// onceTicks: 5 replicas (holdfast processes) fire at every tick, each late
// by its own offset of up to half of AtLeast; the run logs its period and
// token. In tick 2 (and every 7th tick after) the replica that runs is
// killed with SIGKILL while its command runs. Every tick has at most one run, and exactly one unless it
// starts before the killed claim's AtMost (+ free, the store's expiry
// granularity) has passed; tokens increase; the others exit --claimed-exit
// without running. HOLDFAST_ONCE_TICKS overrides the number of ticks.
func onceTicks(t *testing.T, store []string, sched holdfast.Schedule, free time.Duration, ticks int, hold string) {
	if n, err := strconv.Atoi(os.Getenv("HOLDFAST_ONCE_TICKS")); err == nil && n > 0 {
		ticks = n
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "runs")
	t.Setenv("RUNS", log)
	const replicas = 5
	first := sched.Period(time.Now()).Add(sched.Every)
	offsets := make([]time.Duration, replicas)
	for i := range offsets {
		offsets[i] = time.Duration(rand.Int64N(int64(sched.AtLeast / 2)))
	}
	script := `echo "$HOLDFAST_PERIOD $HOLDFAST_TOKEN" >> "$RUNS"; echo ran; sleep "$HOLD"`
	args := append(append([]string{"once"}, store...), "--every", sched.Every.String(), "--at-least", sched.AtLeast.String(), "--at-most", sched.AtMost.String(), "--claimed-exit", "3", "jobs/report", "--", "sh", "-c", script)
	var killed time.Time // the last kill
	kills := 0
	var want []string // the periods that ran, in order
	for k := range ticks {
		p := first.Add(time.Duration(k) * sched.Every)
		kill := k%7 == 2
		if kill {
			t.Setenv("HOLD", "300")
		} else {
			t.Setenv("HOLD", hold)
		}
		procs := make([]*proc, replicas)
		var begun []time.Time
		for i := range replicas {
			time.Sleep(time.Until(p.Add(offsets[i])))
			begun = append(begun, time.Now())
			procs[i] = start(t, args...)
		}
		if kill {
			var runner *proc
			eventually(t, 10*time.Second, "no replica ran in a tick with a kill", func() bool {
				for _, q := range procs {
					if strings.Contains(q.stdout.String(), "ran") {
						runner = q
						return true
					}
				}
				return false
			})
			if err := runner.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = time.Now()
			kills++
		}
		ran, claimed := 0, 0
		for i, q := range procs {
			code := q.wait(t, 30*time.Second)
			switch {
			case code == 3:
				claimed++
			case code == 0 && strings.Contains(q.stdout.String(), "ran"):
				ran++
			case kill && code == 128+int(syscall.SIGKILL):
				ran++ // the killed one
			default:
				t.Errorf("tick %d, replica %d (started %v late): exit %d\nstdout: %s\nstderr: %s", k, i, begun[i].Sub(p), code, q.stdout.String(), q.stderr.String())
			}
		}
		blocked := !kill && !killed.IsZero() && p.Before(killed.Add(sched.AtMost+free))
		if ran > 1 || ran == 0 && !blocked || ran+claimed != replicas {
			t.Errorf("tick %d: %d runs and %d refusals, want 1 run (or none while the killed claim may hold: %v)", k, ran, claimed, blocked)
			for i, q := range procs {
				t.Logf("replica %d: stderr: %s", i, q.stderr.String())
			}
		}
		if ran == 1 {
			want = append(want, p.Format(time.RFC3339))
		}
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != len(want) {
		t.Fatalf("runs logged:\n%s\nwant one per tick that ran (%d)", data, len(want))
	}
	var last uint64
	for k, l := range lines {
		var period string
		var token uint64
		if _, err := fmt.Sscan(l, &period, &token); err != nil {
			t.Fatalf("run line %q: %v", l, err)
		}
		if period != want[k] {
			t.Errorf("run %d: period %s, want %s", k, period, want[k])
		}
		if token <= last {
			t.Errorf("run %d: token %d after %d", k, token, last)
		}
		last = token
	}
	t.Logf("%d replicas x %d ticks (offsets %v, %d SIGKILLs of a running replica): %d runs, one in every tick but %d blocked by a killed claim, tokens increasing", replicas, ticks, offsets, kills, len(want), ticks-len(want))
}

// TestOnceTicks: onceTicks on etcd, every 4 s, at least 1 s, at most 2 s
// (the killed claim blocks no tick).
func TestOnceTicks(t *testing.T) {
	holdfastBin(t) // built before the ticks are laid out
	e := etcdtest.Etcd(t)
	onceTicks(t, []string{"--endpoints", e.Endpoints()[0]}, holdfast.Schedule{Every: 4 * time.Second, AtLeast: time.Second, AtMost: 2 * time.Second}, 1500*time.Millisecond, 6, "0.2")
}

// TestOnceTicksConsul: onceTicks on Consul, every 5 s, at least 1 s, at
// most 20 s (Consul's floor: the killed claim blocks about 4 ticks). The
// job runs 1.2 s.
func TestOnceTicksConsul(t *testing.T) {
	holdfastBin(t)
	a := embedtest.Consul(t)
	onceTicks(t, []string{"--backend", "consul", "--addr", a.HTTPAddr}, holdfast.Schedule{Every: 5 * time.Second, AtLeast: time.Second, AtMost: 20 * time.Second}, 3*time.Second, 9, "1.2")
}

// TestOnceConsul: on Consul, the first replica of a period runs (its key
// is the run's mark NAME/.run, its token the record's ModifyIndex), a
// second one while it runs and a third one after it ended (no --at-least)
// do not run; once they exited, no claim session is left, and the record
// is the one key.
func TestOnceConsul(t *testing.T) {
	holdfastBin(t)
	a := embedtest.Consul(t)
	c := a.Client(t)
	args := []string{"once", "--backend", "consul", "--addr", a.HTTPAddr, "--every", "1h", "--claimed-exit", "3", "ops/report", "--", "sh", "-c", `echo "$HOLDFAST_KEY|$HOLDFAST_TOKEN"; sleep 1`}
	p := start(t, args...)
	eventually(t, 30*time.Second, "the command did not start", func() bool { return strings.Contains(p.stdout.String(), "|") })
	f := strings.Split(strings.TrimSpace(p.stdout.String()), "|")
	pair, _, err := c.KV().Get("ops/report/.run", nil)
	if err != nil || pair == nil || pair.Session == "" {
		t.Fatalf("run key %+v, %v: want it held", pair, err)
	}
	rec, _, err := c.KV().Get("ops/report/.claim", nil)
	if err != nil || rec == nil {
		t.Fatalf("record %+v, %v", rec, err)
	}
	if f[0] != "ops/report/.run" || f[1] != fmt.Sprint(rec.ModifyIndex) {
		t.Errorf("HOLDFAST_KEY=%q HOLDFAST_TOKEN=%q, want ops/report/.run and the record's ModifyIndex %d", f[0], f[1], rec.ModifyIndex)
	}
	q := start(t, args...)
	if code := q.wait(t, 30*time.Second); code != 3 || strings.Contains(q.stdout.String(), "|") {
		t.Errorf("second replica while the first runs: exit %d (want 3, not run); stdout %q stderr %q", code, q.stdout.String(), q.stderr.String())
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("first replica: exit %d; stderr: %s", code, p.stderr.String())
	}
	r := start(t, args...)
	if code := r.wait(t, 30*time.Second); code != 3 || strings.Contains(r.stdout.String(), "|") {
		t.Errorf("third replica after the run: exit %d (want 3, not run); stdout %q stderr %q", code, r.stdout.String(), r.stderr.String())
	}
	if got := r.stderr.String(); got != "" {
		t.Errorf("third replica's stderr %q: want nothing without -v (cron mails any output; a skip is normal)", got)
	}
	v := start(t, append([]string{"once", "-v"}, args[1:]...)...)
	if code := v.wait(t, 30*time.Second); code != 3 {
		t.Errorf("a replica with -v after the run: exit %d, want 3", code)
	}
	if got := v.stderr.String(); strings.Count(got, "holdfast:") != 1 || !strings.Contains(got, "was claimed (token") {
		t.Errorf("with -v, stderr %q: want one line saying the period was claimed, and its token", got)
	}
	all, _, err := c.Session().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if strings.HasPrefix(s.Name, "holdfast") {
			t.Errorf("session %s (%s) left after every replica exited", s.ID, s.Name)
		}
	}
	if ks, _, _ := c.KV().Keys("ops/report/", "", nil); len(ks) != 1 || ks[0] != "ops/report/.claim" {
		t.Errorf("keys left %q, want the record alone", ks)
	}
}

// TestStatusClaim: status of a claim shows kind claim, the last period
// claimed and its token, and the run that holds (etcd: its lease's time
// left; Consul: its session), as text and JSON; once the run ended, the
// period and "no run holds".
func TestStatusClaim(t *testing.T) {
	holdfastBin(t)
	e := etcdtest.Etcd(t)
	a := embedtest.Consul(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sched := holdfast.Schedule{Every: time.Hour, AtMost: 30 * time.Second}
	es, err := hfetcd.NewSession(ctx, e.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	cs, err := hfconsul.NewSession(ctx, a.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	eo, _ := hfetcd.NewOnce(es, "st/claim", sched)
	co, _ := hfconsul.NewOnce(cs, "st/claim", sched)
	ec, err := eo.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := co.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		store []string
		g     holdfast.Grant
	}{
		{[]string{"--endpoints", e.Endpoints()[0]}, ec},
		{[]string{"--backend", "consul", "--addr", a.HTTPAddr}, cc},
	} {
		period := sched.Period(time.Now()).Format(time.RFC3339Nano)
		st := statusJSON(t, append(tc.store, "st/claim")...)
		if st.Kind != "claim" || st.Period != period || st.PeriodToken != uint64(tc.g.Token()) || len(st.Holders) != 1 || len(st.Waiters) != 0 || len(st.Other) != 0 {
			t.Fatalf("status %v: %+v, want a claim of period %s, token %d, one run", tc.store, st, period, tc.g.Token())
		}
		if h := st.Holders[0]; h.Role != "run" || h.Key != "st/claim/.run" || h.Token != uint64(tc.g.Token()) || h.Value != "" || h.Origin != "holdfast" {
			t.Errorf("status %v: run %+v, want the run's key and token, no value", tc.store, h)
		}
		if tc.store[0] == "--endpoints" {
			if left, err := time.ParseDuration(st.Holders[0].Left); err != nil || left <= 0 || left > sched.AtMost {
				t.Errorf("status: run's time left %q, want in (0, AtMost]", st.Holders[0].Left)
			}
		}
		p := start(t, append(append([]string{"status"}, tc.store...), "st/claim")...)
		if code := p.wait(t, 30*time.Second); code != 0 || !strings.Contains(p.stdout.String(), `claim "st/claim" at index`) || !strings.Contains(p.stdout.String(), fmt.Sprintf("period %s claimed, token %d", period, tc.g.Token())) {
			t.Errorf("status %v: exit %d, output %q: want the claim, its period and token", tc.store, code, p.stdout.String())
		}
		if err := tc.g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		p = start(t, append(append([]string{"status"}, tc.store...), "st/claim")...)
		if code := p.wait(t, 30*time.Second); code != 0 || !strings.Contains(p.stdout.String(), fmt.Sprintf("period %s claimed, token %d; no run holds", period, tc.g.Token())) {
			t.Errorf("status %v after the run: exit %d, output %q", tc.store, code, p.stdout.String())
		}
	}
}

// TestOnceFlags: "once --every 1s" runs (--at-most defaults to the store's
// floor, not to a value the user must fix); -v says the token; --at-least
// keeps holdfast (and the run's mark) that long; a silent store ends the
// attempt at --timeout, --try's bound or the period's end with exit 125,
// on both stores; --metrics-addr and --log are accepted.
func TestOnceFlags(t *testing.T) {
	holdfastBin(t)
	e := etcdtest.Etcd(t)
	ep := e.Endpoints()[0]
	// At the start of a second: started in its last milliseconds, the
	// claim has only those to be answered in (exit 125, seen in CI).
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
	p := start(t, "once", "--endpoints", ep, "--every", "1s", "-v", "--log", "text", "--metrics-addr", "127.0.0.1:0", "jobs/fast", "--", "echo", "ran")
	if code := p.wait(t, 30*time.Second); code != 0 || strings.TrimSpace(p.stdout.String()) != "ran" || !strings.Contains(p.stderr.String(), "acquired the claim, token ") {
		t.Errorf("once --every 1s -v: exit %d, stdout %q, stderr %q: want the command run and the token said", code, p.stdout.String(), p.stderr.String())
	}
	// --at-least: holdfast keeps the run marked that long after the claim,
	// then removes the mark (the record alone is left).
	p = start(t, "once", "--endpoints", ep, "--every", "1h", "--at-least", "1500ms", "jobs/spaced", "--", "true")
	if code := p.wait(t, 30*time.Second); code != 0 || p.took < 1500*time.Millisecond {
		t.Errorf("once --at-least 1500ms: exit %d after %v, want 0, no sooner than 1.5s; stderr %q", code, p.took, p.stderr.String())
	}
	if ks := keysUnder(t, e.Client(t), "jobs/spaced/"); !slices.Equal(ks, []string{"jobs/spaced/.claim"}) {
		t.Errorf("keys left after once --at-least: %q, want the record alone", ks)
	}
	// A store that accepts connections and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	silent := ln.Addr().String()
	for _, tc := range []struct {
		args []string
		max  time.Duration
	}{
		{[]string{"--endpoints", silent, "--timeout", "500ms"}, 2 * time.Second},
		{[]string{"--backend", "consul", "--addr", silent, "--timeout", "500ms"}, 2 * time.Second},
		{[]string{"--endpoints", silent, "--try"}, 3500 * time.Millisecond},
		{[]string{"--endpoints", silent, "--every", "2s"}, 3500 * time.Millisecond}, // bounded by the period's end
	} {
		args := append(append([]string{"once", "--every", "1h"}, tc.args...), "jobs/silent", "--", "echo", "ran")
		p := start(t, args...)
		code := p.wait(t, 30*time.Second)
		if code != 125 || p.took > tc.max || strings.Contains(p.stdout.String(), "ran") {
			t.Errorf("holdfast %s: exit %d after %v, want 125 within %v without running; stderr %q", strings.Join(args, " "), code, p.took, tc.max, p.stderr.String())
		}
	}
}
