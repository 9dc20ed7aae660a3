package main

import (
	"os"
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
			pauseCase{name: st.name + "/lock", ttl: st.ttl,
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
// grant, on lock, lock -n, lock --and and elect, on both stores. Before
// the guard knew the deadline, CMD wrote on for the whole pause, seconds
// after the next holder was granted.
func TestPausedHolderStopsCommand(t *testing.T) {
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
	p := start(t, append(append(c.holder, "--"), "sh", "-c", heartbeat, "sh", beats)...)
	eventually(t, 30*time.Second, "the heartbeat did not start", func() bool { _, n := lastStamp(t, beats); return n > 0 })
	next := start(t, append(append(c.next, "-v", "--"), "sh", "-c", `date +%s%N > "$1"`, "sh", granted)...)
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
}
