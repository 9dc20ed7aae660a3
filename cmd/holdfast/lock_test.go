package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// holdfastBin builds the command once per test run and returns its path:
// or returns $HOLDFAST_TEST_BIN, the command built from this tree with
// buildTags (scripts/mutants.sh builds it once for all its rows).
func holdfastBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HOLDFAST_TEST_BIN"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "holdfast-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "holdfast")
		out, err := exec.Command("go", "build", "-tags", buildTags, "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("building holdfast: %v", buildErr)
	}
	return binPath
}

// syncBuffer is a bytes.Buffer safe to read while a process writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) Bytes() []byte { return []byte(b.String()) }

// proc is a holdfast process started by a test.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{}
	code           int
	began          time.Time
	took           time.Duration
}

// start runs holdfast with args; the test kills it at the end if it still
// runs.
func start(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(holdfastBin(t), args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.Env = append(os.Environ(), "HOLDFAST_BACKEND=", "HOLDFAST_ENDPOINTS=", "ETCDCTL_ENDPOINTS=", "CONSUL_HTTP_ADDR=")
	begin := time.Now()
	p.began = begin
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := p.cmd.Wait()
		p.took = time.Since(begin)
		p.code = 0
		p.code = exitCode(err)
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// exitCode is the exit status a shell would report for a process that
// ended with err (cmd.Wait's): 128+N if it was killed by signal N (holdfast
// dies of SIGINT after a Ctrl-C), -1 if it could not be waited for.
func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case !errors.As(err, &ee):
		return -1
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// wait waits for p to exit (at most d) and returns its exit status.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		t.Fatalf("holdfast %v still runs after %v\nstdout: %s\nstderr: %s", p.cmd.Args[1:], d, p.stdout.String(), p.stderr.String())
		return 0
	}
}

// keysUnder lists the keys under prefix.
func keysUnder(t *testing.T, c *clientv3.Client, prefix string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

// eventually polls cond every 20 ms for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLockUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lock"}, "missing NAME"},
		{[]string{"lock", "jobs"}, "missing the command"},
		{[]string{"lock", "jobs", "--"}, "missing the command"},
		{[]string{"lock", "--timeout", "-1s", "jobs", "--", "true"}, "negative"},
		{[]string{"lock", "--kill-grace", "-1s", "jobs", "--", "true"}, "negative"},
		{[]string{"lock", "/jobs", "--", "true"}, "invalid name"},
		{[]string{"lock", "a/.b", "--", "true"}, "invalid name"},
		{[]string{"lock", "--backend", "redis", "jobs", "--", "true"}, "want etcd or consul"},
		{[]string{"lock", "--lock-delay", "1s", "jobs", "--", "true"}, "Consul only"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, tc.args)
		if got := stderr.String(); code != 2 || !strings.Contains(got, tc.want) {
			t.Errorf("holdfast %s: exit %d, want 2; stderr lacks %q:\n%s", strings.Join(tc.args, " "), code, tc.want, got)
		}
	}
}

// TestLockEnvAndExitStatus: the command sees the grant in its environment,
// holdfast exits with its status, and the lock is released after it.
func TestLockEnvAndExitStatus(t *testing.T) {
	e := etcdtest.Etcd(t)
	ep := e.Endpoints()[0]
	c := e.Client(t)
	show := `echo "$HOLDFAST_NAME|$HOLDFAST_KEY|$HOLDFAST_TOKEN|$ETCD_LOCK_KEY|$ETCD_LOCK_REV"; exit 7`
	p := start(t, "lock", "--endpoints", ep, "jobs/nightly", "--", "sh", "-c", show)
	if code := p.wait(t, 30*time.Second); code != 7 {
		t.Fatalf("exit %d, want the command's 7; stderr: %s", code, p.stderr.String())
	}
	f := strings.Split(strings.TrimSpace(p.stdout.String()), "|")
	if len(f) != 5 {
		t.Fatalf("command printed %q", p.stdout.String())
	}
	name, key, token, ekey, erev := f[0], f[1], f[2], f[3], f[4]
	if name != "jobs/nightly" || !strings.HasPrefix(key, "jobs/nightly/") || ekey != key || erev != token {
		t.Errorf("HOLDFAST_NAME=%q HOLDFAST_KEY=%q ETCD_LOCK_KEY=%q: want the name and the holder's key; ETCD_LOCK_REV=%q want HOLDFAST_TOKEN=%q", name, key, ekey, erev, token)
	}
	if n, err := strconv.ParseUint(token, 10, 64); err != nil || n == 0 {
		t.Errorf("HOLDFAST_TOKEN=%q, want a positive revision", token)
	}
	if keys := keysUnder(t, c, "jobs/nightly/"); len(keys) != 0 {
		t.Errorf("keys left after the command exited: %v", keys)
	}

	// A second run gets a higher token; --child-exit-code=false hides the
	// command's status.
	p2 := start(t, "lock", "--endpoints", ep, "--child-exit-code=false", "jobs/nightly", "--", "sh", "-c", show)
	if code := p2.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("--child-exit-code=false: exit %d, want 0; stderr: %s", code, p2.stderr.String())
	}
	f2 := strings.Split(strings.TrimSpace(p2.stdout.String()), "|")
	t1, _ := strconv.ParseUint(token, 10, 64)
	if t2, err := strconv.ParseUint(f2[2], 10, 64); err != nil || t2 <= t1 {
		t.Errorf("second token %q, want above %d", f2[2], t1)
	}

	// A command that cannot run.
	p3 := start(t, "lock", "--endpoints", ep, "jobs/nightly", "--", "/no/such/command")
	if code := p3.wait(t, 30*time.Second); code != exitNotFound {
		t.Errorf("missing command: exit %d, want %d; stderr: %s", code, exitNotFound, p3.stderr.String())
	}
	if keys := keysUnder(t, c, "jobs/nightly/"); len(keys) != 0 {
		t.Errorf("keys left after a command that did not start: %v", keys)
	}
}

// TestLockExcludes: concurrent runs on one name never overlap, and run in
// token order.
func TestLockExcludes(t *testing.T) {
	e := etcdtest.Etcd(t)
	ep := e.Endpoints()[0]
	log := filepath.Join(t.TempDir(), "log")
	body := `echo "start $HOLDFAST_TOKEN" >> "$LOG"; sleep 0.2; echo "end $HOLDFAST_TOKEN" >> "$LOG"`
	t.Setenv("LOG", log)
	var ps []*proc
	for range 4 {
		ps = append(ps, start(t, "lock", "--endpoints", ep, "shared", "--", "sh", "-c", body))
	}
	for _, p := range ps {
		if code := p.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("exit %d; stderr: %s", code, p.stderr.String())
		}
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 8 {
		t.Fatalf("log has %d lines, want 8:\n%s", len(lines), data)
	}
	var last uint64
	for i := 0; i < len(lines); i += 2 {
		s, en := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if s[0] != "start" || en[0] != "end" || s[1] != en[1] {
			t.Fatalf("runs overlapped:\n%s", data)
		}
		tok, _ := strconv.ParseUint(s[1], 10, 64)
		if tok <= last {
			t.Fatalf("token %d after %d:\n%s", tok, last, data)
		}
		last = tok
	}
}

// holdEtcd takes name through a session of the test's own and returns it.
func holdEtcd(t *testing.T, e *etcdtest.Cluster, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := hfetcd.NewSession(ctx, e.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	m, err := hfetcd.NewMutex(s, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLockNotAcquired: --try fails at once and --timeout after it, both with
// 124, leaving no waiter key.
func TestLockNotAcquired(t *testing.T) {
	e := etcdtest.Etcd(t)
	ep := e.Endpoints()[0]
	holdEtcd(t, e, "busy")
	ran := filepath.Join(t.TempDir(), "ran")
	p := start(t, "lock", "--endpoints", ep, "--try", "busy", "--", "touch", ran)
	if code := p.wait(t, 30*time.Second); code != exitNotAcquired || !strings.Contains(p.stderr.String(), "not acquired") {
		t.Errorf("--try on a held lock: exit %d, want %d; stderr: %s", code, exitNotAcquired, p.stderr.String())
	}
	p = start(t, "lock", "--endpoints", ep, "--timeout", "500ms", "busy", "--", "touch", ran)
	if code := p.wait(t, 30*time.Second); code != exitNotAcquired || !strings.Contains(p.stderr.String(), "timed out") {
		t.Errorf("--timeout on a held lock: exit %d, want %d; stderr: %s", code, exitNotAcquired, p.stderr.String())
	}
	if p.took < 500*time.Millisecond {
		t.Errorf("--timeout 500ms gave up after %v", p.took)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the command ran without the lock")
	}
	eventually(t, 5*time.Second, "waiter keys left behind", func() bool { return len(keysUnder(t, e.Client(t), "busy/")) == 1 })
}

// TestLockLost: when the lock is lost (its lease revoked), the command's
// whole process group is stopped at once, SIGKILL following SIGTERM after
// --kill-grace for a command that ignores SIGTERM, and holdfast exits 122.
func TestLockLost(t *testing.T) {
	e := etcdtest.Etcd(t)
	ep := e.Endpoints()[0]
	c := e.Client(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name, script string
		grace        time.Duration
	}{
		{"stops", `echo $$ > "$PIDFILE"; exec sleep 60`, 10 * time.Second},
		{"ignores-sigterm", `trap "" TERM; echo $$ > "$PIDFILE"; sleep 60; echo survived`, 700 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pidfile := filepath.Join(dir, tc.name)
			t.Setenv("PIDFILE", pidfile)
			p := start(t, "lock", "--endpoints", ep, "--kill-grace", tc.grace.String(), "lost/"+tc.name, "--", "sh", "-c", tc.script)
			var pid int
			eventually(t, 20*time.Second, "the command did not start", func() bool {
				b, err := os.ReadFile(pidfile)
				pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				return err == nil && pid > 0
			})
			keys := keysUnder(t, c, "lost/"+tc.name+"/")
			if len(keys) != 1 {
				t.Fatalf("keys %v, want the holder's", keys)
			}
			lease, err := strconv.ParseInt(keys[0][strings.LastIndex(keys[0], "/")+1:], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			revoked := time.Now()
			if _, err := c.Revoke(context.Background(), clientv3.LeaseID(lease)); err != nil {
				t.Fatal(err)
			}
			code := p.wait(t, 20*time.Second)
			took := time.Since(revoked)
			if code != exitLost || !strings.Contains(p.stderr.String(), "lost the lock") {
				t.Fatalf("exit %d, want %d; stderr: %s", code, exitLost, p.stderr.String())
			}
			t.Logf("lease revoked -> command stopped and holdfast exited: %v (kill-grace %v)", took.Round(time.Millisecond), tc.grace)
			if min, max := tc.grace, tc.grace+time.Second; tc.grace < 5*time.Second && (took < min || took > max) {
				t.Errorf("a command ignoring SIGTERM was stopped %v after the loss, want within [%v, %v]", took, min, max)
			} else if tc.grace >= 5*time.Second && took > time.Second {
				t.Errorf("the command was stopped %v after the loss, want within 1 s", took)
			}
			if strings.Contains(p.stdout.String(), "survived") {
				t.Error("the command's process group survived the loss")
			}
			if err := syscall.Kill(pid, 0); err == nil {
				t.Errorf("the command (pid %d) still runs", pid)
			}
		})
	}
}

// TestLockSignals: a signal to holdfast reaches the command (which may
// handle it), and holdfast releases the lock when it exits; a signal while
// waiting stops the wait, leaving no key.
func TestLockSignals(t *testing.T) {
	e := etcdtest.Etcd(t)
	ep := e.Endpoints()[0]
	c := e.Client(t)
	ready := filepath.Join(t.TempDir(), "ready")
	t.Setenv("READY", ready)
	script := `trap 'echo got-term; exit 3' TERM; touch "$READY"; while :; do sleep 0.05; done`
	p := start(t, "lock", "--endpoints", ep, "sig", "--", "sh", "-c", script)
	eventually(t, 20*time.Second, "the command did not start", func() bool { _, err := os.Stat(ready); return err == nil })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 10*time.Second); code != 3 || !strings.Contains(p.stdout.String(), "got-term") {
		t.Fatalf("exit %d, want the command's 3 after it handled SIGTERM; stdout: %s; stderr: %s", code, p.stdout.String(), p.stderr.String())
	}
	if keys := keysUnder(t, c, "sig/"); len(keys) != 0 {
		t.Errorf("keys left after the command exited: %v", keys)
	}

	holdEtcd(t, e, "sig")
	p = start(t, "lock", "--endpoints", ep, "sig", "--", "true")
	eventually(t, 20*time.Second, "the waiter's key did not appear", func() bool { return len(keysUnder(t, c, "sig/")) == 2 })
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 10*time.Second); code != 128+int(syscall.SIGINT) {
		t.Errorf("SIGINT while waiting: exit %d, want %d; stderr: %s", code, 128+int(syscall.SIGINT), p.stderr.String())
	}
	eventually(t, 5*time.Second, "the waiter's key was left behind", func() bool { return len(keysUnder(t, c, "sig/")) == 1 })
}

// TestLockConsul: on Consul the command sees CONSUL_LOCK_HELD and the token
// (the ModifyIndex of the acquiring write), `consul lock` on the same name
// is excluded while holdfast holds it, and a destroyed session stops the
// command with 122.
func TestLockConsul(t *testing.T) {
	a := embedtest.Consul(t)
	bin, err := embedtest.ConsulBinary()
	if err != nil {
		t.Fatal(err)
	}
	c := a.Client(t)
	dir := t.TempDir()
	release, ranNative := filepath.Join(dir, "release"), filepath.Join(dir, "native-ran")
	t.Setenv("RELEASE", release)
	script := `echo "$CONSUL_LOCK_HELD|$HOLDFAST_KEY|$HOLDFAST_TOKEN"; while [ ! -e "$RELEASE" ]; do sleep 0.05; done`
	p := start(t, "lock", "--backend", "consul", "--addr", a.HTTPAddr, "--lock-delay", "0", "ops/deploy", "--", "sh", "-c", script)
	eventually(t, 30*time.Second, "the command did not start", func() bool { return strings.Contains(p.stdout.String(), "|") })
	f := strings.Split(strings.TrimSpace(p.stdout.String()), "|")
	if f[0] != "true" || f[1] != "ops/deploy/.lock" {
		t.Errorf("CONSUL_LOCK_HELD=%q HOLDFAST_KEY=%q, want true and ops/deploy/.lock", f[0], f[1])
	}
	pair, _, err := c.KV().Get("ops/deploy/.lock", nil)
	if err != nil || pair == nil || pair.Session == "" {
		t.Fatalf("lock key %+v, %v: want it held", pair, err)
	}
	if strconv.FormatUint(pair.ModifyIndex, 10) != f[2] {
		t.Errorf("HOLDFAST_TOKEN=%s, want the lock key's ModifyIndex %d", f[2], pair.ModifyIndex)
	}
	native := exec.Command(bin, "lock", "-http-addr="+a.HTTPAddr, "-try=300ms", "ops/deploy", "touch "+ranNative)
	out, err := native.CombinedOutput()
	if err == nil {
		t.Errorf("consul lock -try acquired a lock holdfast holds: %s", out)
	}
	if _, err := os.Stat(ranNative); err == nil {
		t.Error("consul lock's command ran while holdfast held the lock")
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, p.stderr.String())
	}
	// Released: consul lock gets it now.
	if out, err := exec.Command(bin, "lock", "-http-addr="+a.HTTPAddr, "-try=5s", "ops/deploy", "touch "+ranNative).CombinedOutput(); err != nil {
		t.Fatalf("consul lock after holdfast released: %v: %s", err, out)
	}
	if _, err := os.Stat(ranNative); err != nil {
		t.Error("consul lock's command did not run after holdfast released")
	}

	// Loss: destroy the holder's session; the command ignores SIGTERM, so
	// it is killed after --kill-grace.
	_ = os.Remove(release)
	const grace = 700 * time.Millisecond
	p = start(t, "lock", "--backend", "consul", "--addr", a.HTTPAddr, "--lock-delay", "0", "--kill-grace", grace.String(), "ops/deploy", "--",
		"sh", "-c", `trap "" TERM; `+script)
	eventually(t, 30*time.Second, "the command did not start", func() bool { return strings.Contains(p.stdout.String(), "|") })
	pair, _, err = c.KV().Get("ops/deploy/.lock", nil)
	if err != nil || pair == nil || pair.Session == "" {
		t.Fatalf("lock key %+v, %v: want it held", pair, err)
	}
	destroyed := time.Now()
	if _, err := c.Session().Destroy(pair.Session, nil); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != exitLost {
		t.Fatalf("exit %d after the session was destroyed, want %d; stderr: %s", code, exitLost, p.stderr.String())
	}
	took := time.Since(destroyed)
	t.Logf("session destroyed -> command killed and holdfast exited: %v (kill-grace %v)", took.Round(time.Millisecond), grace)
	if took < grace || took > grace+time.Second {
		t.Errorf("the command was stopped %v after the session was destroyed, want within [%v, %v]", took, grace, grace+time.Second)
	}
	if p.took > 0 && !strings.Contains(p.stderr.String(), "lost the lock") {
		t.Errorf("stderr does not say the lock was lost: %s", p.stderr.String())
	}
}

// TestLockExitStatuses covers the exit statuses the usage documents that the
// other tests do not.
func TestLockExitStatuses(t *testing.T) {
	e := etcdtest.Etcd(t)
	ep := e.Endpoints()[0]
	notExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"killed by a signal", []string{"--endpoints", ep, "st", "--", "sh", "-c", "kill -9 $$"}, 128 + 9},
		{"not executable", []string{"--endpoints", ep, "st", "--", notExec}, exitCannotRun},
		{"store unreachable", []string{"--endpoints", "127.0.0.1:1", "st", "--", "true"}, exitFailed},
	} {
		p := start(t, append([]string{"lock"}, tc.args...)...)
		if code := p.wait(t, 30*time.Second); code != tc.code {
			t.Errorf("%s: exit %d, want %d; stderr: %s", tc.name, code, tc.code, p.stderr.String())
		}
	}
	if keys := keysUnder(t, e.Client(t), "st/"); len(keys) != 0 {
		t.Errorf("keys left: %v", keys)
	}
}

// maxConcurrent reads a log of "start"/"end" lines and returns the largest
// number of runs in progress at once.
func maxConcurrent(t *testing.T, log string) (most, runs int) {
	t.Helper()
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Fields(string(data)) {
		switch l {
		case "start":
			n++
			runs++
		case "end":
			n--
		}
		most = max(most, n)
	}
	return most, runs
}

// TestLockPermits: with -n 2, at most two commands run at once, on etcd
// and on Consul, where `consul lock -n 2` shares the permits.
func TestLockPermits(t *testing.T) {
	body := `echo start >> "$LOG"; sleep 0.3; echo end >> "$LOG"`
	t.Run("etcd", func(t *testing.T) {
		e := etcdtest.Etcd(t)
		log := filepath.Join(t.TempDir(), "log")
		t.Setenv("LOG", log)
		var ps []*proc
		for range 5 {
			ps = append(ps, start(t, "lock", "--endpoints", e.Endpoints()[0], "-n", "2", "pool", "--", "sh", "-c", body))
		}
		for _, p := range ps {
			if code := p.wait(t, 60*time.Second); code != 0 {
				t.Fatalf("exit %d; stderr: %s", code, p.stderr.String())
			}
		}
		if most, runs := maxConcurrent(t, log); most != 2 || runs != 5 {
			t.Errorf("%d runs, at most %d at once: want 5 runs, 2 at once", runs, most)
		}
		if keys := keysUnder(t, e.Client(t), "pool/"); len(keys) != 0 {
			t.Errorf("keys left: %v", keys)
		}
	})
	t.Run("consul", func(t *testing.T) {
		a := embedtest.Consul(t)
		bin, err := embedtest.ConsulBinary()
		if err != nil {
			t.Fatal(err)
		}
		log := filepath.Join(t.TempDir(), "log")
		t.Setenv("LOG", log)
		var ps []*proc
		var natives []*exec.Cmd
		for i := range 6 {
			if i%2 == 0 {
				ps = append(ps, start(t, "lock", "--backend", "consul", "--addr", a.HTTPAddr, "-n", "2", "pool", "--", "sh", "-c", body))
				continue
			}
			cmd := exec.Command(bin, "lock", "-http-addr="+a.HTTPAddr, "-n", "2", "pool", body)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			natives = append(natives, cmd)
		}
		for _, p := range ps {
			if code := p.wait(t, 90*time.Second); code != 0 {
				t.Fatalf("exit %d; stderr: %s", code, p.stderr.String())
			}
		}
		for _, cmd := range natives {
			if err := cmd.Wait(); err != nil {
				t.Fatalf("consul lock -n 2: %v", err)
			}
		}
		if most, runs := maxConcurrent(t, log); most > 2 || runs != 6 {
			t.Errorf("%d runs, at most %d at once: want 6 runs, never more than 2 at once", runs, most)
		}
	})
}

// TestLockNativeFirst: with a native client holding the name first
// (concurrency.Mutex, the layout of etcdctl lock; api.Lock, what consul lock
// uses), holdfast lock waits, and runs its command once the native client
// releases; --try fails meanwhile.
func TestLockNativeFirst(t *testing.T) {
	ran := func(dir string) string { return filepath.Join(dir, "ran") }
	check := func(t *testing.T, args []string, release func()) {
		t.Helper()
		dir := t.TempDir()
		p := start(t, append(append([]string{"lock", "--try"}, args...), "--", "touch", ran(dir))...)
		if code := p.wait(t, 30*time.Second); code != exitNotAcquired {
			t.Fatalf("--try while a native client holds: exit %d, want %d; stderr %s", code, exitNotAcquired, p.stderr.String())
		}
		p = start(t, append(append([]string{"lock"}, args...), "--", "touch", ran(dir))...)
		time.Sleep(500 * time.Millisecond)
		if _, err := os.Stat(ran(dir)); err == nil {
			t.Fatal("the command ran while a native client held the lock")
		}
		release()
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("after the native release: exit %d; stderr %s", code, p.stderr.String())
		}
		if _, err := os.Stat(ran(dir)); err != nil {
			t.Fatal("the command did not run after the native release")
		}
	}
	t.Run("etcd", func(t *testing.T) {
		e := etcdtest.Etcd(t)
		ns, err := concurrency.NewSession(e.Client(t))
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Close()
		m := concurrency.NewMutex(ns, "native/first")
		if err := m.Lock(context.Background()); err != nil {
			t.Fatal(err)
		}
		check(t, []string{"--endpoints", e.Endpoints()[0], "native/first"}, func() {
			if err := m.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
		// And holdfast first: the native TryLock fails while the command runs.
		dir := t.TempDir()
		t.Setenv("RELEASE", filepath.Join(dir, "release"))
		p := start(t, "lock", "--endpoints", e.Endpoints()[0], "native/first", "--", "sh", "-c", `touch "$RELEASE.started"; while [ ! -e "$RELEASE" ]; do sleep 0.05; done`)
		eventually(t, 20*time.Second, "the command did not start", func() bool { _, err := os.Stat(filepath.Join(dir, "release.started")); return err == nil })
		if err := m.TryLock(context.Background()); !errors.Is(err, concurrency.ErrLocked) {
			t.Fatalf("native TryLock while holdfast holds: %v, want ErrLocked", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("exit %d", code)
		}
		if err := m.TryLock(context.Background()); err != nil {
			t.Fatalf("native TryLock after holdfast released: %v", err)
		}
	})
	t.Run("consul", func(t *testing.T) {
		a := embedtest.Consul(t)
		l, err := a.Client(t).LockOpts(&api.LockOptions{Key: "native/first/.lock", SessionTTL: "15s"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Lock(nil); err != nil {
			t.Fatal(err)
		}
		check(t, []string{"--backend", "consul", "--addr", a.HTTPAddr, "native/first"}, func() {
			if err := l.Unlock(); err != nil {
				t.Fatal(err)
			}
		})
	})
}
