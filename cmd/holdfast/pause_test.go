package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// heartbeat is a CMD that appends the time (ns since the epoch) to the
// file "$1" every 50 ms, for ever.
const heartbeat = `while :; do date +%s%N >> "$1"; sleep 0.05; done`

// lastStamp is the last time written to the heartbeat file path, and how
// many were written.
func lastStamp(t *testing.T, path string) (time.Time, int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, 0
	}
	lines := strings.Fields(string(b))
	if len(lines) == 0 {
		return time.Time{}, 0
	}
	ns, err := strconv.ParseInt(lines[len(lines)-1], 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return time.Unix(0, ns), len(lines)
}

// pauseCase is a holder's command line (before "--") and how long to
// pause it.
type pauseCase struct {
	name string
	ttl  time.Duration
	// holder is the holdfast command line before "--" of the paused
	// holder and of the next one; other, if not nil, of a holder of what
	// the paused one does not take (the other permit).
	holder, next, other []string
	// trapTerm: CMD ignores SIGTERM, so the guard's SIGKILL must stop it.
	trapTerm bool
}

func pauseCases(t *testing.T) []pauseCase {
	etcd := etcdtest.Etcd(t)
	consul := embedtest.Consul(t)
	const etcdTTL, consulTTL = 2 * time.Second, 10 * time.Second
	stores := []struct {
		name  string
		ttl   time.Duration
		flags []string
	}{
		{"etcd", etcdTTL, []string{"--endpoints", etcd.Endpoints()[0], "--ttl", etcdTTL.String()}},
		{"consul", consulTTL, []string{"--backend", "consul", "--addr", consul.HTTPAddr, "--ttl", consulTTL.String(), "--lock-delay", "0"}},
	}
	var cases []pauseCase
	for _, st := range stores {
		with := func(args ...string) []string { return append(args, st.flags...) }
		n := "pause-" + st.name + "/"
		cases = append(cases,
			pauseCase{name: st.name + "/lock", ttl: st.ttl, trapTerm: true,
				holder: with("lock", "--kill-grace", "1s", n+"lock"), next: with("lock", n+"lock")},
			pauseCase{name: st.name + "/lock-n", ttl: st.ttl,
				holder: with("lock", "-n", "2", "--kill-grace", "1s", n+"sem"), next: with("lock", "-n", "2", n+"sem"), other: with("lock", "-n", "2", n+"sem")},
			pauseCase{name: st.name + "/lock-and", ttl: st.ttl,
				holder: with("lock", "--kill-grace", "1s", n+"a", "--and", n+"b"), next: with("lock", n+"b")},
			pauseCase{name: st.name + "/elect", ttl: st.ttl,
				holder: with("elect", "--value", "paused", "--kill-grace", "1s", n+"elect"), next: with("elect", "--value", "next", n+"elect")},
		)
	}
	return cases
}

// TestPausedHolderStopsCommand: holdfast stopped (SIGSTOP) for twice the
// TTL and 2 s while its CMD writes a heartbeat: the guard stops CMD before the
// grant's deadline, so CMD's last write comes before the next holder's
// grant, on lock, lock -n, lock --and and elect, on both stores (with
// lock, CMD ignores SIGTERM: the guard's SIGKILL stops it). Before
// the guard knew the deadline, CMD wrote on for the whole pause, seconds
// after the next holder was granted.
func TestPausedHolderStopsCommand(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup // all at once, whatever -parallel: they mostly sleep
	defer wg.Wait()
	for _, c := range pauseCases(t) {
		wg.Go(func() { t.Run(c.name, func(t *testing.T) { pausedHolder(t, c) }) })
	}
}

func pausedHolder(t *testing.T, c pauseCase) {
	dir := t.TempDir()
	if c.other != nil { // the other permit, held throughout
		o := start(t, append(append(c.other, "-v", "--"), "sleep", "600")...)
		eventually(t, 30*time.Second, "the other permit was not granted", func() bool { return strings.Contains(o.stderr.String(), "acquired") })
	}
	beats, granted := filepath.Join(dir, "beats"), filepath.Join(dir, "granted")
	script := heartbeat
	if c.trapTerm {
		script = `trap "" TERM; ` + heartbeat
	}
	p := start(t, append(append(c.holder, "--"), "sh", "-c", script, "sh", beats)...)
	eventually(t, 30*time.Second, "the heartbeat did not start", func() bool { _, n := lastStamp(t, beats); return n > 0 })
	next := start(t, append(append(c.next, "-v", "--"), "sh", "-c", `date +%s%N > "$1"`, "sh", granted)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the paused holder's stderr: %q; the next holder's: %q", p.stderr.String(), next.stderr.String())
		}
	})
	eventually(t, 10*time.Second, "the next holder does not wait", func() bool { return strings.Contains(next.stderr.String(), "waiting") })
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	time.Sleep(2*c.ttl + 2*time.Second) // Consul expires sessions up to 2 x TTL late
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	code := p.wait(t, 10*time.Second)
	if next.wait(t, 3*c.ttl) != 0 {
		t.Fatalf("the next holder failed: %s", next.stderr.String())
	}
	last, _ := lastStamp(t, beats)
	got, _ := lastStamp(t, granted)
	t.Logf("stopped at 0; CMD's last write %v, next holder's grant %v: %v apart (TTL %v)", last.Sub(stopped).Round(time.Millisecond), got.Sub(stopped).Round(time.Millisecond), got.Sub(last).Round(time.Millisecond), c.ttl)
	if !last.Before(got) {
		t.Errorf("CMD wrote %v after the next holder was granted\nholder's stderr: %s", last.Sub(got), p.stderr.String())
	}
	if code != exitLost || !strings.Contains(p.stderr.String(), "holdfast: guard:") {
		t.Errorf("the paused holder exited %d, want %d, with the guard's message; stderr: %s", code, exitLost, p.stderr.String())
	}
	// At TTL 2 s there is no room for a grace (termGrace): SIGKILL alone.
	wantTerm := termGrace(time.Second, c.ttl) > 0
	if c.trapTerm && (strings.Contains(p.stderr.String(), "SIGTERM to the command's process group") != wantTerm || !strings.Contains(p.stderr.String(), "SIGKILL to the command's process group")) {
		t.Errorf("CMD ignores SIGTERM: want the guard's SIGTERM (%v), then its SIGKILL; stderr: %s", wantTerm, p.stderr.String())
	}
}

// TestFrozenStoreExit: the store freezes (a proxy stops passing bytes)
// while CMD runs: the grant is lost, CMD is stopped, and holdfast exits
// 122 within --kill-grace + 1 s of CMD's end, leaving the release to the
// store's expiry, on both stores; a waiter gives its session up at its
// safe deadline too, and exits 125 saying so (it never held anything).
// Before, holdfast waited for the store (its session's close) 2 s (etcd)
// and 10 s (Consul) after CMD's end, and the waiter said "grant lost", and
// later that the session "expired", when the store still listed it.
func TestFrozenStoreExit(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Etcd(t)
	consul := embedtest.Consul(t)
	const grace = time.Second
	cases := []struct {
		name, target string
		flags        func(addr string) []string
	}{
		{"etcd", strings.TrimPrefix(etcd.Endpoints()[0], "http://"), func(addr string) []string {
			return []string{"--endpoints", "http://" + addr, "--ttl", "2s"}
		}},
		{"consul", consul.HTTPAddr, func(addr string) []string {
			return []string{"--backend", "consul", "--addr", addr, "--ttl", "10s", "--lock-delay", "0"}
		}},
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, c := range cases {
		wg.Go(func() {
			t.Run(c.name, func(t *testing.T) {
				proxy := embedtest.StartProxy(t, c.target)
				beats := filepath.Join(t.TempDir(), "beats")
				args := append([]string{"lock", "--kill-grace", grace.String()}, c.flags(proxy.Addr())...)
				p := start(t, append(args, "frozen/"+c.name, "--", "sh", "-c", heartbeat, "sh", beats)...)
				eventually(t, 30*time.Second, "the heartbeat did not start", func() bool { _, n := lastStamp(t, beats); return n > 0 })
				w := start(t, append(args, "-v", "frozen/"+c.name, "--", "true")...)
				eventually(t, 10*time.Second, "the waiter does not wait", func() bool { return strings.Contains(w.stderr.String(), "waiting") })
				proxy.Pause()
				frozen := time.Now()
				t.Cleanup(proxy.Mend)
				var exited time.Time
				select {
				case <-p.done:
					exited = time.Now()
				case <-time.After(30 * time.Second):
					t.Fatalf("holdfast still runs 30 s after the store froze; stderr: %s", p.stderr.String())
				}
				last, _ := lastStamp(t, beats)
				t.Logf("store frozen at 0: CMD's last write %v, holdfast exited %v (%v after CMD's end)", last.Sub(frozen).Round(time.Millisecond), exited.Sub(frozen).Round(time.Millisecond), exited.Sub(last).Round(time.Millisecond))
				if p.code != exitLost {
					t.Errorf("exit %d, want %d; stderr: %s", p.code, exitLost, p.stderr.String())
				}
				if d := exited.Sub(last); d > grace+time.Second {
					t.Errorf("holdfast exited %v after CMD's last write, want within --kill-grace + 1 s (%v)", d, grace+time.Second)
				}
				code := w.wait(t, 20*time.Second)
				t.Logf("the waiter exited %v after the freeze: %d, %q", w.took-frozen.Sub(w.began), code, w.stderr.String())
				if msg := w.stderr.String(); code != exitFailed || strings.Contains(msg, "lost") || strings.Contains(msg, "expired") || !strings.Contains(msg, "holdfast gave the session up at its safe deadline, before it was granted") {
					t.Errorf("the waiter exited %d, want %d saying holdfast gave the session up at its safe deadline, before it was granted; stderr: %s", code, exitFailed, msg)
				}
			})
		})
	}
}

// TestGuardFirstDeadline: CMD stops holdfast (SIGSTOP) as soon as it
// starts, before holdfast's first feed of the guard, and ignores SIGTERM:
// the guard knows the grant's deadline from its start and kills CMD
// before the next holder's grant. Before, the guard had no deadline until
// the first feed, so CMD wrote on for the whole stop (5 s past the next
// holder's grant in the breaker's run).
func TestGuardFirstDeadline(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	dir := t.TempDir()
	beats, granted := filepath.Join(dir, "beats"), filepath.Join(dir, "granted")
	const ttl = 2 * time.Second
	flags := []string{"--endpoints", e.Endpoints()[0], "--ttl", ttl.String()}
	p := start(t, append(append([]string{"lock", "--kill-grace", "500ms"}, flags...), "first-deadline", "--", "sh", "-c", `kill -STOP $PPID; trap "" TERM; `+heartbeat, "sh", beats)...)
	eventually(t, 30*time.Second, "the heartbeat did not start", func() bool { _, n := lastStamp(t, beats); return n > 0 })
	stopped := time.Now()
	next := start(t, append(append([]string{"lock"}, flags...), "first-deadline", "--", "sh", "-c", `date +%s%N > "$1"`, "sh", granted)...)
	if next.wait(t, 3*ttl+5*time.Second) != 0 {
		t.Fatalf("the next holder failed: %s", next.stderr.String())
	}
	time.Sleep(time.Second)
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	code := p.wait(t, 10*time.Second)
	last, _ := lastStamp(t, beats)
	got, _ := lastStamp(t, granted)
	t.Logf("CMD's last write %v after its first, next holder's grant %v: %v apart; exit %d", last.Sub(stopped).Round(time.Millisecond), got.Sub(stopped).Round(time.Millisecond), got.Sub(last).Round(time.Millisecond), code)
	if !last.Before(got) {
		t.Errorf("CMD wrote %v after the next holder was granted\nholder's stderr: %s", last.Sub(got), p.stderr.String())
	}
	if code != exitLost {
		t.Errorf("exit %d, want %d; stderr: %s", code, exitLost, p.stderr.String())
	}
}

// TestGuardFirstDeadlineUnfed: the guard alone, started with a deadline
// 1.5 s away, told CMD's group and never fed (holdfast stopped before its
// first feed): it stops CMD by that deadline. TestGuardFirstDeadline shows
// the same end to end, but there CMD must win a race with holdfast's first
// feed; here nothing feeds the guard, so its absence fails every run.
func TestGuardFirstDeadlineUnfed(t *testing.T) {
	t.Parallel()
	deadline := time.Now().Add(1500 * time.Millisecond)
	g, err := newGuard(200*time.Millisecond, monoNow()+int64(time.Until(deadline)))
	if err != nil || g == nil {
		t.Fatalf("newGuard: %v, %v", g, err)
	}
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		g.standDown()
		t.Fatal(err)
	}
	g.send(msgGroup, int64(cmd.Process.Pid))
	defer g.standDown()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
		if late := time.Since(deadline); late > 0 {
			t.Fatalf("CMD stopped %v after the guard's deadline", late)
		}
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatal("CMD still ran 3.5 s after the deadline the guard was started with: unfed, the guard had no deadline")
	}
}
