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

// TestSignalStopsStoppedCommand: CMD stops itself (SIGSTOP), then
// holdfast gets SIGTERM: CMD gets SIGTERM and SIGCONT and ends of it, or,
// ignoring SIGTERM, gets SIGKILL after --kill-grace; holdfast releases
// the lock and exits with CMD's status. Before, the SIGTERM stayed pending
// in the stopped CMD, and holdfast kept the lock, renewed, until kill -9.
func TestSignalStopsStoppedCommand(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	const grace = 500 * time.Millisecond
	for _, c := range []struct {
		name, script string
		code         int
		within       time.Duration
	}{
		{"term", `echo $$ > "$1"; kill -STOP $$; echo resumed`, 128 + int(syscall.SIGTERM), time.Second},
		{"ignores-term", `trap "" TERM; echo $$ > "$1"; kill -STOP $$; sleep 30`, 128 + int(syscall.SIGKILL), grace + time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pidFile := filepath.Join(t.TempDir(), "pid")
			name := "stopped-cmd/" + c.name
			p := start(t, "lock", "--endpoints", e.Endpoints()[0], "--ttl", "2s", "--kill-grace", grace.String(), name, "--", "sh", "-c", c.script, "sh", pidFile)
			var pid int
			eventually(t, 30*time.Second, "CMD did not stop itself", func() bool {
				b, _ := os.ReadFile(pidFile)
				pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
				i := strings.LastIndexByte(string(st), ')')
				return pid > 0 && i > 0 && i+2 < len(st) && st[i+2] == 'T'
			})
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
			termed := time.Now()
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			code := p.wait(t, 10*time.Second)
			took := time.Since(termed)
			t.Logf("SIGTERM to holdfast: exit %d after %v", code, took.Round(time.Millisecond))
			if code != c.code || took > c.within {
				t.Errorf("exit %d after %v, want %d within %v; stderr: %s", code, took, c.code, c.within, p.stderr.String())
			}
			if keys := keysUnder(t, e.Client(t), name+"/"); len(keys) != 0 {
				t.Errorf("keys %v left, want the lock released", keys)
			}
		})
	}
}
