package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// writerLog reads a log of "WHO NS" lines: per writer, its first and last
// time.
func writerLog(t *testing.T, path string) (first, last map[string]time.Time) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	first, last = map[string]time.Time{}, map[string]time.Time{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		at := time.Unix(0, ns)
		if _, ok := first[f[0]]; !ok {
			first[f[0]] = at
		}
		last[f[0]] = at
	}
	return first, last
}

// termIgnoringWriter is a CMD that ignores SIGTERM and appends "$1 <ns>"
// to the file "$2" every 50 ms.
const termIgnoringWriter = `trap "" TERM; while :; do echo "$1 $(date +%s%N)" >> "$2"; sleep 0.05; done`

// TestShardKillGrace: the group's only shard moves from A to B (when B
// joins, or when A leaves on SIGTERM: the balance decides) while A's CMD
// ignores SIGTERM: it gets SIGKILL after --kill-grace, and B's CMD starts
// only after it stopped writing. Before, the
// SIGKILL was never sent: the shard was released after the drain timeout
// (--kill-grace + 5 s) while CMD still ran, and the next owner's CMD
// overlapped it (0.5 s here, 2.4 s with a 3 s grace).
func TestShardKillGrace(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	log := filepath.Join(t.TempDir(), "log")
	const grace = 500 * time.Millisecond
	args := func(who string) []string {
		return []string{"shard", "--endpoints", e.Endpoints()[0], "--ttl", "2s", "--kill-grace", grace.String(), "--shards", "1",
			"shard-kill/group", "--", "sh", "-c", termIgnoringWriter, "sh", who, log}
	}
	a := start(t, args("A")...)
	eventually(t, 10*time.Second, "A's CMD did not start", func() bool { _, l := writerLog(t, log); return !l["A"].IsZero() })
	b := start(t, args("B")...)
	time.Sleep(time.Second) // B joins and waits for the shard
	termed := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "B's CMD did not start", func() bool { _, l := writerLog(t, log); return !l["B"].IsZero() })
	code := a.wait(t, 10*time.Second)
	first, last := writerLog(t, log)
	t.Logf("after SIGTERM: A's CMD last wrote at %v, B's first at %v; A exit %d after %v", last["A"].Sub(termed).Round(time.Millisecond), first["B"].Sub(termed).Round(time.Millisecond), code, time.Since(termed).Round(time.Millisecond))
	if !last["A"].Before(first["B"]) {
		t.Errorf("A's CMD wrote %v after B's CMD started: two owners of the shard", last["A"].Sub(first["B"]))
	}
	if d := last["A"].Sub(termed); d > grace+time.Second { // a move on B's join ended it before the SIGTERM
		t.Errorf("A's CMD wrote %v after the SIGTERM, want SIGKILL after --kill-grace %v", d, grace)
	}
	if code != 0 {
		t.Errorf("A: exit %d after SIGTERM, want 0; stderr:\n%s", code, a.stderr.String())
	}
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := b.wait(t, 10*time.Second); code != 0 {
		t.Errorf("B: exit %d after SIGTERM, want 0; stderr:\n%s", code, b.stderr.String())
	}
}
