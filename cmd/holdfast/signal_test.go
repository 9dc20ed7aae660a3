package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
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

// TestGuardGone: the guard process is killed (kill -9) while CMD runs:
// holdfast stops CMD (SIGTERM, SIGKILL after --kill-grace) and exits 122,
// saying why: without its guard, CMD would outlive the grant should
// holdfast be stopped next. Before, holdfast said nothing and CMD ran on
// unguarded (the breaker's run: guard killed, then holdfast stopped: CMD
// wrote 2.97 s past the next holder's grant).
func TestGuardGone(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	dir := t.TempDir()
	beats, pidFile := filepath.Join(dir, "beats"), filepath.Join(dir, "pid")
	const grace = 500 * time.Millisecond
	p := start(t, "lock", "--endpoints", e.Endpoints()[0], "--ttl", "2s", "--kill-grace", grace.String(), "guard-gone", "--",
		"sh", "-c", `echo $$ > "$2"; trap "" TERM; `+heartbeat, "sh", beats, pidFile)
	var cmdPid int
	eventually(t, 30*time.Second, "the heartbeat did not start", func() bool {
		b, _ := os.ReadFile(pidFile)
		cmdPid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		_, n := lastStamp(t, beats)
		return cmdPid > 0 && n > 0
	})
	var guard int
	eventually(t, 5*time.Second, "no guard process beside the command", func() bool {
		for _, k := range childrenOf(t, p.cmd.Process.Pid) {
			if k != cmdPid {
				guard = k
			}
		}
		return guard != 0
	})
	killed := time.Now()
	if err := syscall.Kill(guard, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code := p.wait(t, 10*time.Second)
	last, _ := lastStamp(t, beats)
	t.Logf("guard killed: CMD's last write %v later, holdfast exit %d after %v", last.Sub(killed).Round(time.Millisecond), code, time.Since(killed).Round(time.Millisecond))
	if code != exitLost || !strings.Contains(p.stderr.String(), "guard process died") {
		t.Errorf("exit %d, want %d saying the guard died; stderr: %s", code, exitLost, p.stderr.String())
	}
	if d := last.Sub(killed); d > grace+time.Second {
		t.Errorf("CMD wrote %v after its guard was killed, want stopped within --kill-grace %v", d, grace)
	}
	if running(cmdPid) {
		t.Errorf("CMD %d still runs", cmdPid)
	}
}

// TestStopWhileWaiting: a waiter that is a shell's job (its own process
// group) gets SIGTSTP (Ctrl-Z): it leaves the queue (its key is gone) and
// stops; SIGCONT (fg) puts it back in the queue, and it gets the lock
// once the holder is done. Before, the stopped waiter kept its place: the
// others behind it waited until its session expired.
func TestStopWhileWaiting(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	c := e.Client(t)
	flags := []string{"--endpoints", e.Endpoints()[0], "--ttl", "5s"} // a stopped waiter's session outlives the test's steps
	holder := start(t, append(append([]string{"lock", "-v"}, flags...), "tstp-wait", "--", "sleep", "60")...)
	eventually(t, 30*time.Second, "the holder did not get the lock", func() bool { return strings.Contains(holder.stderr.String(), "acquired") })
	w := &proc{done: make(chan struct{})}
	w.cmd = exec.Command(holdfastBin(t), append(append([]string{"lock", "-v"}, flags...), "tstp-wait", "--", "true")...)
	w.cmd.Stdout, w.cmd.Stderr = &w.stdout, &w.stderr
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a job of its own, as a shell starts it
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.code = exitCode(w.cmd.Wait()); close(w.done) }()
	t.Cleanup(func() { _ = w.cmd.Process.Kill(); <-w.done })
	eventually(t, 10*time.Second, "the waiter does not wait", func() bool { return len(keysUnder(t, c, "tstp-wait/")) == 2 })
	if err := w.cmd.Process.Signal(syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Second, "the stopped waiter is still in the queue", func() bool { return len(keysUnder(t, c, "tstp-wait/")) == 1 })
	eventually(t, 5*time.Second, "the waiter did not stop", func() bool {
		st, _ := os.ReadFile("/proc/" + strconv.Itoa(w.cmd.Process.Pid) + "/stat")
		i := strings.LastIndexByte(string(st), ')')
		return i > 0 && i+2 < len(st) && st[i+2] == 'T'
	})
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the resumed waiter is not back in the queue", func() bool { return len(keysUnder(t, c, "tstp-wait/")) == 2 })
	if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := w.wait(t, 10*time.Second); code != 0 || !strings.Contains(w.stderr.String(), "left the queue") {
		t.Errorf("the resumed waiter: exit %d, want 0 after saying it left the queue; stderr: %s", code, w.stderr.String())
	}
	holder.wait(t, 10*time.Second)
}

// TestStopSignalWithGrant: a stop signal that reaches holdfast as its lock
// is granted (taken by the wait's watcher after the grant) is not lost: as
// during the wait, CMD does not start, the lock is released, and holdfast
// exits 128+N. The acquire here gets the lock, then sends the signal and
// returns once the watcher has taken it: the moment breaker33 hit in 1 to
// 4 % of runs with a signal sent 10-16 ms after start.
func TestStopSignalWithGrant(t *testing.T) {
	e := etcdtest.Etcd(t)
	fs := flag.NewFlagSet("lock", flag.ContinueOnError)
	sf := addStoreFlags(fs)
	if err := fs.Parse([]string{"--endpoints", e.Endpoints()[0]}); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr syncBuffer
	r := runner{e: &env{stdout: &stdout, stderr: &stderr}, what: "the lock", grace: time.Second, childCode: true, native: true}
	ran := filepath.Join(t.TempDir(), "ran")
	err := r.run(context.Background(), sf, func(ctx context.Context, s *session) (holdfast.Grant, error) {
		l, err := s.mutex("sig/grant")
		if err != nil {
			return nil, err
		}
		g, err := l.Lock(ctx)
		if err != nil {
			return nil, err
		}
		if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done(): // the watcher took it
		case <-time.After(5 * time.Second):
		}
		return g, nil
	}, "sig/grant", []string{"touch", ran})
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 128+int(syscall.SIGTERM) {
		t.Errorf("run with SIGTERM as the lock was granted: %v, want exit %d", err, 128+int(syscall.SIGTERM))
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("CMD ran after a SIGTERM that came with the grant")
	}
	if ks := keysUnder(t, e.Client(t), "sig/grant"); len(ks) != 0 {
		t.Errorf("keys %v after exit: want the lock released", ks)
	}
}
