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

// TestReleaseStopsLeftovers: CMD exits leaving two processes in the
// background, one that ends on SIGTERM and one that ignores it: both are
// gone before the lock is released (SIGTERM, then SIGKILL after
// --kill-grace), and holdfast exits with CMD's status. Before, both ran
// on, without the lock, after holdfast had released it and exited.
func TestReleaseStopsLeftovers(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	const grace = 500 * time.Millisecond
	p := start(t, "lock", "--endpoints", e.Endpoints()[0], "--kill-grace", grace.String(), "leftovers", "--", "sh", "-c",
		`sleep 30 & echo $! >> "$1"; (trap "" TERM; exec sleep 30) & echo $! >> "$1"; exit 3`, "sh", pids)
	code := p.wait(t, 10*time.Second)
	b, err := os.ReadFile(pids)
	if err != nil {
		t.Fatal(err)
	}
	var left []int
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		if running(pid) {
			left = append(left, pid)
		}
	}
	t.Logf("exit %d after %v; stderr: %q", code, p.took.Round(time.Millisecond), p.stderr.String())
	if code != 3 {
		t.Errorf("exit %d, want CMD's 3", code)
	}
	if len(left) > 0 {
		t.Errorf("CMD's background processes %v still run after holdfast released the lock and exited", left)
	}
	if !strings.Contains(p.stderr.String(), "leaving processes in its process group") {
		t.Errorf("holdfast did not say it stopped what CMD left; stderr: %s", p.stderr.String())
	}
	if keys := keysUnder(t, e.Client(t), "leftovers/"); len(keys) != 0 {
		t.Errorf("keys %v left, want the lock released", keys)
	}
}
