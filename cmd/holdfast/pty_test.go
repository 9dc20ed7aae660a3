package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// The commands that must stop on Ctrl-Z are bash scripts: dash vforks,
// and a dash whose vfork child is stopped before its exec waits for it in
// state D and never stops (a job of bash itself would not be reported
// stopped either).

// shell is an interactive bash on a pseudo-terminal, as a user's: holdfast
// typed at its prompt runs as a job in the terminal's foreground.
type shell struct {
	master *os.File
	out    syncBuffer
	cmd    *exec.Cmd
}

// openPTY opens a new pseudo-terminal: its master, closed at the end of
// the test, and its slave.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

// startShell starts bash -i in a new session whose controlling terminal
// is a new pseudo-terminal, with holdfast on its PATH.
func startShell(t *testing.T) *shell {
	t.Helper()
	m, s := openPTY(t)
	sh := &shell{master: m}
	sh.cmd = exec.Command("bash", "--norc", "--noprofile", "-i")
	sh.cmd.Stdin, sh.cmd.Stdout, sh.cmd.Stderr = s, s, s
	sh.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	sh.cmd.Env = append(os.Environ(), "PS1=$ ", "TERM=dumb", "PATH="+filepath.Dir(holdfastBin(t))+":"+os.Getenv("PATH"),
		"HOLDFAST_BACKEND=", "HOLDFAST_ENDPOINTS=", "ETCDCTL_ENDPOINTS=", "CONSUL_HTTP_ADDR=")
	if err := sh.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	copied := make(chan struct{})
	go func() { defer close(copied); _, _ = io.Copy(&sh.out, m) }()
	t.Cleanup(func() {
		_ = sh.cmd.Process.Kill()
		_ = sh.cmd.Wait()
		<-copied
	})
	sh.expect(t, "$ ", 1)
	return sh
}

// typ types s at the terminal.
func (sh *shell) typ(t *testing.T, s string) {
	t.Helper()
	if _, err := sh.master.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// expect waits until the terminal has shown s n times.
func (sh *shell) expect(t *testing.T, s string, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for strings.Count(sh.out.String(), s) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the terminal did not show %q %d times in 15 s; it shows:\n%s", s, n, sh.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procState is the state letter of pid in /proc (R, S, T...), or "" if
// it is gone.
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// parentOf is pid's parent's pid.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// cmdPids waits for the command to write its pid to path and returns it
// and holdfast's, both killed at the end of the test.
func cmdPids(t *testing.T, path string) (cmd, holdfast int) {
	t.Helper()
	eventually(t, 20*time.Second, "the command did not start", func() bool {
		b, err := os.ReadFile(path)
		cmd, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && cmd > 0
	})
	holdfast = parentOf(t, cmd)
	t.Cleanup(func() {
		_ = syscall.Kill(holdfast, syscall.SIGKILL)
		_ = syscall.Kill(-cmd, syscall.SIGKILL)
	})
	return cmd, holdfast
}

// termRead: holdfast run from an interactive shell gives CMD the
// terminal: CMD reads the line typed, and Ctrl-C ends it, holdfast
// releasing the lock and exiting with CMD's status (130). Before, CMD's
// read stopped it (SIGTTIN: not the terminal's foreground group) holding
// the lock for ever, and Ctrl-C reached holdfast only.
func termRead(t *testing.T, e *etcdtest.Cluster) {
	c := e.Client(t)
	sh := startShell(t)
	pidfile := filepath.Join(t.TempDir(), "pid")
	sh.typ(t, fmt.Sprintf(`holdfast lock --endpoints %s tty/read -- bash -c 'echo $$ > "$1"; read x; echo "got:$x"; exec sleep 30' sh %s`+"\n", e.Endpoints()[0], pidfile))
	cmd, hf := cmdPids(t, pidfile)
	if keys := keysUnder(t, c, "tty/read/"); len(keys) != 1 {
		t.Fatalf("keys %v, want the holder's", keys)
	}
	sh.typ(t, "hello\n")
	sh.expect(t, "got:hello", 1)
	// Ctrl-C once CMD sleeps: a bash interrupted while it forks may go on.
	eventually(t, 5*time.Second, "CMD does not sleep", func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd) + "/comm")
		return string(b) == "sleep\n"
	})
	sh.typ(t, "\x03")
	fg, _ := unix.IoctlGetInt(int(sh.master.Fd()), unix.TIOCGPGRP)
	eventually(t, 5*time.Second, fmt.Sprintf("holdfast runs on after Ctrl-C (holdfast %d %s, CMD %d %s, the terminal's group %d; terminal: %q)", hf, procState(hf), cmd, procState(cmd), fg, sh.out.String()), func() bool { return !running(hf) })
	if keys := keysUnder(t, c, "tty/read/"); len(keys) != 0 {
		t.Errorf("keys %v left after Ctrl-C, want the lock released", keys)
	}
	sh.typ(t, `echo "rc=$?"`+"\n")
	sh.expect(t, "rc=130", 1)
}

// termJobControl: Ctrl-Z stops CMD and holdfast as one job; fg
// resumes both while the grant lasts. Stopped for longer than the TTL,
// CMD is killed by the guard before the grant's deadline, and fg reports
// the loss (122).
func termJobControl(t *testing.T, e *etcdtest.Cluster) {
	c := e.Client(t)
	sh := startShell(t)
	dir := t.TempDir()
	pidfile, beats := filepath.Join(dir, "pid"), filepath.Join(dir, "beats")
	const ttl = 2 * time.Second
	sh.typ(t, fmt.Sprintf(`holdfast lock --endpoints %s --ttl %v tty/job -- bash -c 'echo $$ > "$1"; %s' sh %s`+"\n", e.Endpoints()[0], ttl, strings.ReplaceAll(heartbeat, "$1", beats), pidfile))
	cmd, hf := cmdPids(t, pidfile)
	count := func() int { _, n := lastStamp(t, beats); return n }
	eventually(t, 5*time.Second, "no heartbeat", func() bool { return count() > 0 })

	sh.typ(t, "\x1a")
	sh.expect(t, "Stopped", 1)
	eventually(t, 5*time.Second, "Ctrl-Z did not stop both holdfast and CMD", func() bool { return procState(hf) == "T" && procState(cmd) == "T" })
	n := count()
	time.Sleep(300 * time.Millisecond)
	if count() != n {
		t.Error("CMD wrote while stopped")
	}
	sh.typ(t, "fg\n")
	eventually(t, 5*time.Second, "fg did not resume CMD", func() bool { return count() > n+2 })
	if procState(hf) == "T" || len(keysUnder(t, c, "tty/job/")) != 1 {
		t.Fatalf("after fg: holdfast %s, keys %v: want it running, holding the lock", procState(hf), keysUnder(t, c, "tty/job/"))
	}

	sh.typ(t, "\x1a")
	sh.expect(t, "Stopped", 2)
	stopped := time.Now()
	eventually(t, 2*ttl, "CMD still there a TTL after Ctrl-Z", func() bool { return !running(cmd) })
	t.Logf("stopped by Ctrl-Z; CMD killed by the guard %v later (TTL %v)", time.Since(stopped).Round(time.Millisecond), ttl)
	time.Sleep(ttl)
	sh.typ(t, "fg\n")
	sh.expect(t, "lost the lock", 1)
	eventually(t, 5*time.Second, "holdfast runs on after fg", func() bool { return !running(hf) })
	sh.typ(t, `echo "rc=$?"`+"\n")
	sh.expect(t, "rc=122", 1)
	if last, _ := lastStamp(t, beats); last.After(stopped) {
		t.Errorf("CMD wrote %v after Ctrl-Z", last.Sub(stopped))
	}
}

// termStopSignal: SIGTSTP to holdfast (no terminal) stops
// CMD with it, and SIGCONT resumes both. Before, holdfast stopped alone
// and CMD ran on.
func termStopSignal(t *testing.T, e *etcdtest.Cluster) {
	dir := t.TempDir()
	pidfile, beats := filepath.Join(dir, "pid"), filepath.Join(dir, "beats")
	p := start(t, "lock", "--endpoints", e.Endpoints()[0], "tstp", "--", "bash", "-c", `echo $$ > "$2"; `+heartbeat, "sh", beats, pidfile)
	cmd, _ := cmdPids(t, pidfile)
	count := func() int { _, n := lastStamp(t, beats); return n }
	eventually(t, 5*time.Second, "no heartbeat", func() bool { return count() > 0 })
	if err := p.cmd.Process.Signal(syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	var states string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("holdfast's and CMD's states: %s; stderr: %s", states, p.stderr.String())
		}
	})
	eventually(t, 5*time.Second, "SIGTSTP did not stop both holdfast and CMD", func() bool {
		states = procState(p.cmd.Process.Pid) + procState(cmd)
		return states == "TT"
	})
	n := count()
	time.Sleep(300 * time.Millisecond)
	if count() != n {
		t.Error("CMD wrote while stopped")
	}
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "SIGCONT did not resume CMD", func() bool { return count() > n+2 })
	if s := procState(p.cmd.Process.Pid); s == "T" {
		t.Errorf("holdfast still stopped (%s)", s)
	}
}

// termNoJobControl: holdfast leading its own session on a
// terminal (ssh -t, docker run -t: no shell to resume a stopped job),
// Ctrl-Z does nothing (as the kernel does for such a process group):
// CMD runs on and holdfast keeps the lock; Ctrl-C ends CMD, and holdfast
// exits 130. Stopping itself, holdfast would wait for ever for an fg
// nobody can type.
func termNoJobControl(t *testing.T, e *etcdtest.Cluster) {
	m, s := openPTY(t)
	dir := t.TempDir()
	pidfile, beats := filepath.Join(dir, "pid"), filepath.Join(dir, "beats")
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(holdfastBin(t), "lock", "--endpoints", e.Endpoints()[0], "tty/nojobs", "--", "bash", "-c", `echo $$ > "$2"; `+heartbeat, "sh", beats, pidfile)
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = s, s, s
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	var out syncBuffer
	go func() { _, _ = io.Copy(&out, m) }()
	waited := make(chan int, 1)
	go func() {
		waited <- exitCode(p.cmd.Wait())
	}()
	t.Cleanup(func() { _ = p.cmd.Process.Kill() })
	cmd, hf := cmdPids(t, pidfile)
	count := func() int { _, n := lastStamp(t, beats); return n }
	eventually(t, 5*time.Second, "no heartbeat", func() bool { return count() > 0 })
	if _, err := m.WriteString("\x1a"); err != nil {
		t.Fatal(err)
	}
	n := count()
	eventually(t, 5*time.Second, "CMD does not run on after Ctrl-Z", func() bool { return count() > n+10 })
	if procState(hf) == "T" || procState(cmd) == "T" {
		t.Fatalf("after Ctrl-Z: holdfast %s, CMD %s: want both running", procState(hf), procState(cmd))
	}
	// Ctrl-C, again each second: a bash interrupted while it forks may go
	// on (its child took the signal before its exec).
	for i := 0; ; i++ {
		if _, err := m.WriteString("\x03"); err != nil {
			t.Fatal(err)
		}
		var code int
		select {
		case code = <-waited:
		case <-time.After(time.Second):
			if i < 5 {
				continue
			}
			t.Fatalf("holdfast runs on after Ctrl-C; terminal: %s", out.String())
		}
		if code != 130 {
			t.Errorf("holdfast exited %d after Ctrl-C, want 130; terminal: %s", code, out.String())
		}
		break
	}
	if keys := keysUnder(t, e.Client(t), "tty/nojobs/"); len(keys) != 0 {
		t.Errorf("keys %v left, want the lock released", keys)
	}
}

// termBackground: started in the background (&), a CMD that reads
// the terminal stops (SIGTTIN) and holdfast with it, as one stopped job;
// fg hands CMD the terminal, and it reads the line typed.
func termBackground(t *testing.T, e *etcdtest.Cluster) {
	sh := startShell(t)
	pidfile := filepath.Join(t.TempDir(), "pid")
	sh.typ(t, fmt.Sprintf(`holdfast lock --endpoints %s tty/bg -- sh -c 'echo $$ > "$1"; read x; echo "got:$x"' sh %s &`+"\n", e.Endpoints()[0], pidfile))
	cmd, hf := cmdPids(t, pidfile)
	eventually(t, 5*time.Second, "the job did not stop", func() bool { return procState(hf) == "T" && procState(cmd) == "T" })
	// The job is stopped before bash has taken in the news (its SIGCHLD
	// handler runs later): ask until it knows, or fg would not resume it.
	asked := 0
	eventually(t, 5*time.Second, "bash does not see the job stopped", func() bool {
		if strings.Contains(sh.out.String(), "Stopped") {
			return true
		}
		if asked++; asked%10 == 1 {
			sh.typ(t, "jobs\n")
		}
		return false
	})
	sh.typ(t, "fg\n")
	eventually(t, 5*time.Second, "fg did not resume both", func() bool { return procState(hf) != "T" && procState(cmd) != "T" })
	sh.typ(t, "hello\n")
	sh.expect(t, "got:hello", 1)
	eventually(t, 5*time.Second, "holdfast runs on after CMD's end", func() bool { return !running(hf) })
	sh.typ(t, `echo "rc=$?"`+"\n")
	sh.expect(t, "rc=0", 1)
}

// termShardJob: holdfast shard run from an interactive shell, owning
// three shards: one Ctrl-Z stops every CMD and holdfast as one job, and
// one fg resumes all of them. Before, each shard's CMD stopped holdfast
// on its own: fg resumed it only for the next shard to stop it again, and
// the shell showed the job stopped once per owned shard.
func termShardJob(t *testing.T, e *etcdtest.Cluster) {
	sh := startShell(t)
	dir := t.TempDir()
	const shards = 3
	sh.typ(t, fmt.Sprintf(`holdfast shard --endpoints %s --shards %d tty/shards -- bash -c 'echo $$ > "$1/pid.$HOLDFAST_SHARD"; %s' sh %s`+"\n",
		e.Endpoints()[0], shards, strings.ReplaceAll(heartbeat, `"$1"`, `"$1/beats.$HOLDFAST_SHARD"`), dir))
	var cmds []int
	var hf int
	for i := range shards {
		c, h := cmdPids(t, filepath.Join(dir, fmt.Sprintf("pid.%d", i)))
		cmds, hf = append(cmds, c), h
	}
	counts := func() []int {
		var n []int
		for i := range shards {
			_, c := lastStamp(t, filepath.Join(dir, fmt.Sprintf("beats.%d", i)))
			n = append(n, c)
		}
		return n
	}
	states := func() string {
		s := procState(hf)
		for _, c := range cmds {
			s += procState(c)
		}
		return s
	}
	eventually(t, 5*time.Second, "no heartbeat", func() bool { return !slices.Contains(counts(), 0) })

	sh.typ(t, "\x1a")
	sh.expect(t, "Stopped", 1)
	eventually(t, 5*time.Second, "Ctrl-Z did not stop holdfast and every CMD", func() bool { return states() == "TTTT" })
	stopped := counts()
	time.Sleep(300 * time.Millisecond)
	if !slices.Equal(counts(), stopped) {
		t.Errorf("a CMD wrote while stopped: %v, then %v", stopped, counts())
	}
	sh.typ(t, "fg\n")
	eventually(t, 5*time.Second, fmt.Sprintf("one fg did not resume holdfast and every CMD (states %s; terminal: %q)", states(), sh.out.String()), func() bool {
		n := counts()
		for i := range n {
			if n[i] < stopped[i]+3 {
				return false
			}
		}
		return !strings.Contains(states(), "T")
	})
	time.Sleep(300 * time.Millisecond)
	if strings.Count(sh.out.String(), "Stopped") != 1 || strings.Contains(states(), "T") {
		t.Errorf("after one fg: states %s, terminal: %q: want every process running, stopped once", states(), sh.out.String())
	}
	sh.typ(t, "\x03")
	eventually(t, 10*time.Second, "holdfast shard runs on after Ctrl-C", func() bool { return !running(hf) })
}

// TestTerminal: the terminal and job control cases, on one etcd (see
// each function).
func TestTerminal(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	for _, c := range []struct {
		name string
		run  func(*testing.T, *etcdtest.Cluster)
	}{
		{"Read", termRead}, {"JobControl", termJobControl}, {"StopSignal", termStopSignal},
		{"NoJobControl", termNoJobControl}, {"Background", termBackground}, {"ShardJob", termShardJob},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, e) })
	}
}
