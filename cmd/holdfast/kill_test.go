package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// running reports whether pid is a live process (a zombie waiting for its
// new parent to reap it does not run).
func running(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

// TestKill9StopsCommand: when holdfast is killed with SIGKILL while CMD
// runs under a lock, a permit or leadership, CMD and what it started are
// gone within a second, long before the session TTL (10 s) could let
// another holder in. Before the guard, CMD (in its own process group) ran
// on, re-parented, for as long as it liked.
func TestKill9StopsCommand(t *testing.T) {
	const ttl, within = 10 * time.Second, time.Second
	etcd := etcdtest.Etcd(t)
	consul := embedtest.Consul(t)
	stores := []struct {
		name  string
		flags []string
	}{
		{"etcd", []string{"--endpoints", etcd.Endpoints()[0], "--ttl", ttl.String()}},
		{"consul", []string{"--backend", "consul", "--addr", consul.HTTPAddr, "--ttl", ttl.String(), "--lock-delay", "0"}},
	}
	commands := []struct {
		name string
		args func(name string) []string
	}{
		{"lock", func(name string) []string { return []string{"lock", name} }},
		{"lock-n", func(name string) []string { return []string{"lock", "-n", "3", name} }},
		{"elect", func(name string) []string { return []string{"elect", "--value", "v", name} }},
	}
	// CMD records its pid and that of a background child in its process
	// group, then writes until stopped.
	script := `sleep 600 & echo $! > "$DIR/bg"; echo $$ > "$DIR/cmd"; while :; do echo w >> "$DIR/writes"; sleep 0.02; done`
	for _, st := range stores {
		for _, c := range commands {
			t.Run(st.name+"/"+c.name, func(t *testing.T) {
				dir := t.TempDir()
				t.Setenv("DIR", dir)
				args := append(c.args("kill9/"+c.name), st.flags...)
				p := start(t, append(args, "--", "sh", "-c", script)...)
				pids := map[string]int{}
				eventually(t, 30*time.Second, "the command did not start", func() bool {
					for _, f := range []string{"cmd", "bg"} {
						b, err := os.ReadFile(filepath.Join(dir, f))
						if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
							pids[f] = pid
						}
					}
					return len(pids) == 2
				})
				t.Cleanup(func() {
					for _, pid := range pids {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				})
				killed := time.Now()
				if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				select {
				case <-p.done:
				case <-time.After(5 * time.Second): // say which process is left
					out, _ := exec.Command("ps", "-eo", "pid,ppid,pgid,sid,stat,etime,args").Output()
					var rel []string
					for _, l := range strings.Split(string(out), "\n") {
						if strings.Contains(l, "sleep") || strings.Contains(l, "holdfast") || strings.Contains(l, "sh -c") {
							rel = append(rel, l)
						}
					}
					t.Fatalf("holdfast %v still runs (or its pipes are held) 5s after kill -9: CMD %d running %v, its child %d running %v\n%s", p.cmd.Args[1:], pids["cmd"], running(pids["cmd"]), pids["bg"], running(pids["bg"]), strings.Join(rel, "\n"))
				}
				eventually(t, within, "CMD or its child runs on after holdfast was killed", func() bool {
					return !running(pids["cmd"]) && !running(pids["bg"])
				})
				t.Logf("holdfast killed -> CMD and its child gone in %v (TTL %v)", time.Since(killed).Round(time.Millisecond), ttl)
			})
		}
	}
}

// childrenOf lists the pids whose parent is pid.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, child)
		}
	}
	return kids
}

// TestKill9ParentDeathSignal: with the guard process stopped first (so only
// the kernel's parent-death signal is left; a killed guard makes holdfast
// stop CMD, TestGuardGone), kill -9 of holdfast still
// ends CMD itself at once, as the README says; what CMD started is the
// guard's to stop, and runs on here.
func TestKill9ParentDeathSignal(t *testing.T) {
	e := etcdtest.Etcd(t)
	dir := t.TempDir()
	t.Setenv("DIR", dir)
	p := start(t, "lock", "--endpoints", e.Endpoints()[0], "pdeath", "--", "sh", "-c", `echo $$ > "$DIR/cmd"; while :; do sleep 0.02; done`)
	var cmdPid int
	eventually(t, 30*time.Second, "the command did not start", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "cmd"))
		cmdPid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && cmdPid > 0
	})
	t.Cleanup(func() { _ = syscall.Kill(cmdPid, syscall.SIGKILL) })
	var guard int
	eventually(t, 5*time.Second, "no guard process beside the command", func() bool {
		for _, k := range childrenOf(t, p.cmd.Process.Pid) {
			if k != cmdPid {
				guard = k
			}
		}
		return guard != 0
	})
	t.Cleanup(func() { _ = syscall.Kill(guard, syscall.SIGKILL) })
	if err := syscall.Kill(guard, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "the guard did not stop", func() bool {
		st, _ := os.ReadFile("/proc/" + strconv.Itoa(guard) + "/stat")
		i := strings.LastIndexByte(string(st), ')')
		return i > 0 && i+2 < len(st) && st[i+2] == 'T'
	})
	if !running(cmdPid) {
		t.Fatal("stopping the guard stopped the command")
	}
	killed := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "CMD runs on after holdfast was killed (no parent-death signal)", func() bool { return !running(cmdPid) })
	t.Logf("guard killed, then holdfast: CMD gone in %v", time.Since(killed).Round(time.Millisecond))
}
