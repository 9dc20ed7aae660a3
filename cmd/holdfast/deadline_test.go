package main

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// TestDeadlineStopsCommand: the store silent to holdfast alone (its link
// frozen by a proxy, holdfast alive) or holdfast stopped (SIGSTOP), with
// the default --kill-grace (10 s) at TTL 3 s and a CMD that ignores
// SIGTERM and writes a timestamp every 50 ms: CMD is dead by the grant's
// deadline (SIGTERM 0.4 s before it, SIGKILL just before), so its last
// write comes before the next holder's grant (that holder reaches the
// store directly), and holdfast exits 122. Before, with the store silent
// and holdfast alive, holdfast sent SIGTERM at the deadline and SIGKILL
// --kill-grace after it: CMD wrote 9.6 s after the next holder's grant.
func TestDeadlineStopsCommand(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	const ttl = 3 * time.Second
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, mode := range []string{"frozen", "paused"} {
		wg.Go(func() {
			t.Run(mode, func(t *testing.T) {
				proxy := embedtest.StartProxy(t, strings.TrimPrefix(e.Endpoints()[0], "http://"))
				t.Cleanup(proxy.Mend)
				dir := t.TempDir()
				beats, granted := filepath.Join(dir, "beats"), filepath.Join(dir, "granted")
				name := "deadline/" + mode
				p := start(t, "lock", "--endpoints", proxy.URL(), "--ttl", ttl.String(), name, "--", "sh", "-c", `trap "" TERM; `+heartbeat, "sh", beats)
				eventually(t, 10*time.Second, "the heartbeat did not start", func() bool { _, n := lastStamp(t, beats); return n > 0 })
				next := start(t, "lock", "-v", "--endpoints", e.Endpoints()[0], "--ttl", ttl.String(), name, "--", "sh", "-c", `date +%s%N > "$1"`, "sh", granted)
				eventually(t, 10*time.Second, "the next holder does not wait", func() bool { return strings.Contains(next.stderr.String(), "waiting") })
				cut := time.Now()
				if mode == "frozen" {
					proxy.Pause()
				} else {
					if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
						t.Fatal(err)
					}
					time.Sleep(2 * ttl)
					if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
						t.Fatal(err)
					}
				}
				code := p.wait(t, 20*time.Second)
				if next.wait(t, 10*time.Second) != 0 {
					t.Fatalf("the next holder failed: %s", next.stderr.String())
				}
				last, _ := lastStamp(t, beats)
				got, _ := lastStamp(t, granted)
				t.Logf("%s at 0: CMD's last write %v, the next holder's grant %v (%v later), holdfast exited %d at %v", mode, last.Sub(cut).Round(time.Millisecond), got.Sub(cut).Round(time.Millisecond), got.Sub(last).Round(time.Millisecond), code, p.took-cut.Sub(p.began))
				if !last.Before(got) {
					t.Errorf("CMD wrote %v after the next holder was granted; holdfast's stderr: %s", last.Sub(got), p.stderr.String())
				}
				msg := p.stderr.String()
				// The SIGKILL at the deadline is the guard's or, holdfast
				// alive, holdfast's own, whichever comes first.
				if code != exitLost || !strings.Contains(msg, "SIGTERM to the command's process group") {
					t.Errorf("holdfast exited %d, want %d after the guard's SIGTERM; stderr: %s", code, exitLost, msg)
				}
			})
		})
	}
}

// TestShortPause: holdfast stopped (SIGSTOP) for 1.5 s across a renewal,
// with the defaults (TTL 15 s, --kill-grace 10 s) and a healthy store,
// leaves CMD alone: its deadline stays more than TTL/5 ahead. Before, the
// guard found the feed stopped after 1 s and sent SIGTERM, the deadline
// being less than --kill-grace away: CMD died, and holdfast exited 143, as
// if CMD had failed. A stop that is warranted exits 122: a pause brings
// the deadline within its SIGTERM grace with no renewal; the guard
// stops CMD, and holdfast, resumed before the deadline and renewing again,
// reports the loss (before: CMD's own 143, the lock released). That is at
// TTL 4 s, a 2.4 s pause: at TTL 2 s no renewal can be a second late
// without a loss, and the guard's SIGTERM comes with its SIGKILL.
func TestShortPause(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	cases := []struct {
		name          string
		ttl           []string
		at, pause     time.Duration
		end           time.Duration // the stop file is made then
		wantCode      int
		wantGuardStop bool
	}{
		{name: "defaults", at: 4 * time.Second, pause: 1500 * time.Millisecond, end: 6500 * time.Millisecond, wantCode: 0},
		{name: "warranted", ttl: []string{"--ttl", "4s"}, at: 1600 * time.Millisecond, pause: 2400 * time.Millisecond, end: 4500 * time.Millisecond, wantCode: exitLost, wantGuardStop: true},
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, c := range cases {
		wg.Go(func() {
			t.Run(c.name, func(t *testing.T) {
				dir := t.TempDir()
				beats, stop := filepath.Join(dir, "beats"), filepath.Join(dir, "stop")
				args := append(append([]string{"lock", "--endpoints", e.Endpoints()[0]}, c.ttl...), "pause/"+c.name, "--", "sh", "-c",
					`while [ ! -e "$2" ]; do date +%s%N >> "$1"; sleep 0.05; done`, "sh", beats, stop)
				p := start(t, args...)
				eventually(t, 10*time.Second, "the heartbeat did not start", func() bool { _, n := lastStamp(t, beats); return n > 0 })
				t0 := time.Now()
				time.Sleep(c.at)
				if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				time.Sleep(c.pause)
				if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Until(t0.Add(c.end)))
				_, before := lastStamp(t, beats)
				if err := os.WriteFile(stop, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				code := p.wait(t, 10*time.Second)
				last, n := lastStamp(t, beats)
				msg := p.stderr.String()
				t.Logf("paused %v at %v: exit %d, CMD's last write at %v, %d writes (%d when asked to end); stderr: %q", c.pause, c.at, code, last.Sub(t0).Round(time.Millisecond), n, before, msg)
				if code != c.wantCode {
					t.Errorf("holdfast exited %d, want %d; stderr: %s", code, c.wantCode, msg)
				}
				if stopped := strings.Contains(msg, "holdfast: guard:"); stopped != c.wantGuardStop {
					t.Errorf("the guard stopped CMD: %v, want %v; stderr: %s", stopped, c.wantGuardStop, msg)
				}
				if !c.wantGuardStop && last.Before(t0.Add(c.end-300*time.Millisecond)) {
					t.Errorf("CMD's last write at %v, want it running until %v", last.Sub(t0), c.end)
				}
			})
		})
	}
}

// TestStallLoop: elect --loop whose CMD the guard stopped for a stall
// (holdfast paused 2.4 s at TTL 4 s, resumed before the deadline, so its
// session lives on) campaigns again with a new session and reruns CMD
// under a new term, instead of campaigning through the session that still
// holds the old leadership.
func TestStallLoop(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	terms := filepath.Join(t.TempDir(), "terms")
	p := start(t, "elect", "--endpoints", e.Endpoints()[0], "--ttl", "4s", "--loop", "stall/loop", "--value", "v", "--",
		"sh", "-c", `echo "$HOLDFAST_TOKEN" >> "$1"; exec sleep 30`, "sh", terms)
	read := func() []string { b, _ := os.ReadFile(terms); return strings.Fields(string(b)) }
	eventually(t, 10*time.Second, "CMD did not start", func() bool { return len(read()) == 1 })
	time.Sleep(1600 * time.Millisecond)
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2400 * time.Millisecond)
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "CMD was not run again", func() bool { return len(read()) == 2 })
	got := read()
	t.Logf("terms %v; stderr: %q", got, p.stderr.String())
	if got[0] == got[1] || !strings.Contains(p.stderr.String(), "campaigning again") {
		t.Errorf("terms %v: want CMD rerun under a new term after the guard's stop; stderr: %s", got, p.stderr.String())
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 10*time.Second)
	if keys := keysUnder(t, e.Client(t), "stall/loop/"); len(keys) != 0 {
		t.Errorf("keys %v left", keys)
	}
}
