package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// TestExitStatusTableAgrees: the exit status table of every command that
// runs something or reads a store (lock, elect, once, status, shard) lists the
// rows of the README's table that name the command, no more, no fewer; the
// README's default bound is status's.
func TestExitStatusTableAgrees(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "| exit status | of | meaning |\n|---|---|---|\n")
	if !ok {
		t.Fatal("README has no exit status table")
	}
	md := map[string][]string{} // command: its statuses, in the README's order
	for _, l := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(l, "| ") {
			break
		}
		cells := strings.Split(l, "|")
		status := strings.Trim(strings.TrimSpace(cells[1]), "`")
		for _, m := range regexp.MustCompile("`([a-z]+)[^`]*`").FindAllStringSubmatch(cells[2], -1) {
			md[m[1]] = append(md[m[1]], status)
		}
	}
	for _, c := range []*command{lockCommand, electCommand, onceCommand, statusCommand, shardCommand} {
		help := helpStatuses(t, c)
		if !slices.Equal(help, md[c.name]) {
			t.Errorf("%s --help lists the exit statuses %q, the README's table %q", c.name, help, md[c.name])
		}
	}
	if want := "5 s unless `--timeout`"; statusTimeout != 5*time.Second || !strings.Contains(string(readme), want) {
		t.Errorf("status's default --timeout is %v; the README's table should say %q", statusTimeout, want)
	}
	if want := []string{"CMD's own", "2", "122", "124", "125", "126, 127", "128+N"}; !slices.Equal(helpStatuses(t, lockCommand), want) {
		t.Errorf("lock --help lists %q, TestExitStatusRows covers %q", helpStatuses(t, lockCommand), want)
	}
}

// helpStatuses returns the first column of the "Exit status:" table of c's
// usage.
func helpStatuses(t *testing.T, c *command) []string {
	t.Helper()
	_, table, ok := strings.Cut(c.usage, "Exit status:\n")
	if !ok {
		t.Fatalf("%s's usage has no exit status table", c.name)
	}
	var statuses []string
	for _, l := range strings.Split(table, "\n") {
		if len(l) > 2 && l[2] != ' ' {
			statuses = append(statuses, strings.TrimSpace(l[:min(18, len(l))]))
		}
	}
	return statuses
}

// TestExitStatusRows: one case (or more) per row of the exit status table,
// with the built binary against embedded etcd. Usage and input errors exit
// 2 before any request: they are tried against a listener that never
// answers, where a request would hang.
func TestExitStatusRows(t *testing.T) {
	e := etcdtest.Etcd(t)
	ep := e.Endpoints()[0]
	silent := silentListener(t)
	dir := t.TempDir()

	// 2: usage and input errors, found before any request.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lock"}, "missing NAME and the command"},
		{[]string{"lock", "--", "true"}, "missing NAME before -- true"},
		{[]string{"lock", "jobs"}, "missing the command to run after NAME jobs"},
		{[]string{"lock", "jobs", "--", ""}, "the command to run after NAME jobs is an empty string"},
		{[]string{"lock", "jobs", "extra", "--", "true"}, "one NAME before --"},
		{[]string{"lock", "--bogus", "jobs", "--", "true"}, "unknown flag"},
		{[]string{"lock", "a//b", "--", "true"}, "invalid name"},
		{[]string{"lock", "a\u200bb", "--", "true"}, "invalid name"},
		{[]string{"lock", "-n", "0", "jobs", "--", "true"}, "at least 1"},
		{[]string{"lock", "--timeout", "-1s", "jobs", "--", "true"}, "negative"},
		{[]string{"lock", "--ttl", "-5s", "jobs", "--", "true"}, "invalid TTL"},
		{[]string{"lock", "--ttl", "1ms", "jobs", "--", "true"}, "invalid TTL"},
		{[]string{"lock", "--backend", "redis", "jobs", "--", "true"}, "want etcd or consul"},
		{[]string{"lock", "--lock-delay", "1s", "jobs", "--", "true"}, "Consul only"},
		{[]string{"lock", "--token", "x", "jobs", "--", "true"}, "Consul only"},
		{[]string{"elect", "jobs", "--", "true"}, "--value is required"},
		{[]string{"elect", "--value", "v", "--ttl", "-5s", "jobs", "--", "true"}, "invalid TTL"},
		{[]string{"elect", "--observe", "a//b"}, "invalid name"},
		{[]string{"lock", "--ttl", "0", "jobs", "--", "true"}, "invalid TTL: 0s"},
		{[]string{"shard", "jobs", "--", "true"}, "--shards N is required"},
		{[]string{"shard", "--shards", "100000000", "jobs", "--", "true"}, "want 1 to 65536"},
		{[]string{"lock", "--backend", "consul", "--addr", silent, "--ttl", "0", "jobs", "--", "true"}, "invalid TTL: 0s"},
		{[]string{"lock", "--backend", "consul", "--addr", silent, "--lock-delay=-1s", "jobs", "--", "true"}, "lock-delay -1s"},
		{[]string{"lock", "--backend", "consul", "--addr", silent, "--lock-delay=2m", "jobs", "--", "true"}, "lock-delay 2m0s"},
		{[]string{"elect", "--value", "v", "--ttl", "0", "jobs", "--", "true"}, "invalid TTL: 0s"},
		{[]string{"elect", "--value", "v", "--timeout", "-1s", "jobs", "--", "true"}, "negative"},
		{[]string{"elect", "--observe", "--try", "jobs"}, "--try applies to campaigning only"},
		{[]string{"elect", "--observe", "--ttl", "10s", "jobs"}, "without a session: --ttl applies to campaigning only"},
		{[]string{"elect", "--observe", "--backend", "consul", "--addr", silent, "--lock-delay", "0", "jobs"}, "--lock-delay applies to campaigning only"},
		{[]string{"elect", "--observe", "--metrics-addr", "127.0.0.1:0", "jobs"}, "--metrics-addr applies to campaigning only"},
		{[]string{"elect", "--observe", "--timeout", "0", "jobs"}, "want a positive duration"},
		{[]string{"status", "--timeout", "0", "jobs"}, "want a positive duration"},
	} {
		at := []string{"--endpoints", silent}
		if slices.Contains(tc.args, "consul") { // --addr silent is given
			at = nil
		}
		p := start(t, append(append([]string{tc.args[0]}, at...), tc.args[1:]...)...)
		code := p.wait(t, 10*time.Second)
		if msg := p.stderr.String(); code != 2 || !strings.Contains(msg, tc.want) || p.took > time.Second {
			t.Errorf("holdfast %q: exit %d after %v, want 2 within 1 s (no request); stderr lacks %q:\n%s", tc.args, code, p.took, tc.want, msg)
		}
	}

	// CMD's own, 126, 127, 125.
	notExec := filepath.Join(dir, "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		row  string
		args []string
		code int
		want string
	}{
		{"CMD's own", []string{"--endpoints", ep, "rows", "--", "sh", "-c", "exit 7"}, 7, ""},
		{"CMD's own, killed", []string{"--endpoints", ep, "rows", "--", "sh", "-c", "kill -9 $$"}, 128 + 9, ""},
		{"CMD's own, --child-exit-code=false", []string{"--child-exit-code=false", "--endpoints", ep, "rows", "--", "sh", "-c", "exit 7"}, 0, ""},
		{"126", []string{"--endpoints", ep, "rows", "--", notExec}, exitCannotRun, "permission denied"},
		{"127", []string{"--endpoints", ep, "rows", "--", filepath.Join(dir, "absent")}, exitNotFound, "no such file"},
		{"125", []string{"--endpoints", refusedAddr(t), "--timeout", "1s", "rows", "--", "true"}, exitFailed, "connection refused"},
	} {
		p := start(t, append([]string{"lock"}, tc.args...)...)
		if code := p.wait(t, 30*time.Second); code != tc.code || !strings.Contains(p.stderr.String(), tc.want) {
			t.Errorf("row %s: exit %d, want %d; stderr lacks %q: %s", tc.row, code, tc.code, tc.want, p.stderr.String())
		}
	}

	// 124 and 128+N: the lock held elsewhere.
	holdEtcd(t, e, "rows")
	p := start(t, "lock", "--endpoints", ep, "--try", "rows", "--", "true")
	if code := p.wait(t, 30*time.Second); code != exitNotAcquired || !strings.Contains(p.stderr.String(), "rows: not acquired") {
		t.Errorf("row 124: exit %d; stderr: %s", code, p.stderr.String())
	}
	p = start(t, "lock", "--endpoints", ep, "rows", "--", "true")
	eventually(t, 20*time.Second, "the waiter's key did not appear", func() bool { return len(keysUnder(t, e.Client(t), "rows/")) == 2 })
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	if code := p.wait(t, 10*time.Second); code != 128+int(syscall.SIGINT) {
		t.Errorf("row 128+N: exit %d, want %d; stderr: %s", code, 128+int(syscall.SIGINT), p.stderr.String())
	}

	// 122: the lease revoked while CMD runs.
	p = start(t, "lock", "--endpoints", ep, "rows2", "--", "sleep", "60")
	var keys []string
	eventually(t, 20*time.Second, "the holder's key did not appear", func() bool { keys = keysUnder(t, e.Client(t), "rows2/"); return len(keys) == 1 })
	lease, err := strconv.ParseInt(keys[0][len("rows2/"):], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client(t).Revoke(context.Background(), clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != exitLost {
		t.Errorf("row 122: exit %d; stderr: %s", code, p.stderr.String())
	}
	// The loss said once per layer, the cause without the sentinels' prefixes.
	want := regexp.MustCompile(`(?m)^holdfast lock: rows2: lost the lock while the command ran: rows2/[0-9a-f]+ was deleted \(lease revoked or key removed\)$`)
	if msg := p.stderr.String(); !want.MatchString(msg) || strings.Count(msg, "holdfast:") != 1 {
		t.Errorf("row 122: stderr %q, want one line matching %s and one holdfast: line (the notice)", msg, want)
	}
}

// TestErrorMessages: one prefix per layer and the name once; a semaphore
// limit mismatch is said as such, on both stores.
func TestErrorMessages(t *testing.T) {
	e := etcdtest.Etcd(t)
	a := embedtest.Consul(t)
	for _, st := range []struct {
		name  string
		flags []string
	}{
		{"etcd", []string{"--endpoints", e.Endpoints()[0]}},
		{"consul", []string{"--backend", "consul", "--addr", a.HTTPAddr, "--lock-delay", "0"}},
	} {
		t.Run(st.name, func(t *testing.T) {
			ready := filepath.Join(t.TempDir(), "ready")
			hold := func(args ...string) {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					defer close(done)
					var o, er bytes.Buffer
					run(ctx, &env{&o, &er}, append(append(args, st.flags...), "--", "sh", "-c", `touch "$0"; sleep 60`, ready))
				}()
				t.Cleanup(func() { cancel(); <-done })
				eventually(t, 20*time.Second, "the holder did not start", func() bool { _, err := os.Stat(ready); return err == nil })
				os.Remove(ready)
			}
			hold("lock", "-n", "2", "msg/sem")
			hold("lock", "-n", "2", "msg/sem")
			hold("lock", "msg/mu")
			for _, tc := range []struct {
				args []string
				code int
				want string
			}{
				{[]string{"lock", "-n", "2", "--try", "msg/sem"}, exitNotAcquired, `^holdfast lock: msg/sem: not acquired: [^:]*$`},
				{[]string{"lock", "--try", "msg/mu"}, exitNotAcquired, `^holdfast lock: msg/mu: not acquired: [^:]*$`},
				{[]string{"lock", "-n", "3", "--try", "msg/sem"}, exitFailed, `^holdfast lock: msg/sem: semaphore limit mismatch: [^:]*(: clients must agree on the limit)?$`},
				{[]string{"lock", "--try", "msg/sem"}, exitFailed, `^holdfast lock: msg/sem: in use by another kind of lock or a longer name: `},
			} {
				var o, er bytes.Buffer
				code := run(context.Background(), &env{&o, &er}, append(append(tc.args, st.flags...), "--", "true"))
				msg := strings.TrimSpace(er.String())
				if code != tc.code || !regexp.MustCompile(tc.want).MatchString(msg) || len(regexp.MustCompile(`holdfast( \w+|/\w+)?: `).FindAllString(msg, -1)) != 1 {
					t.Errorf("holdfast %q: exit %d, want %d; message %q, want %s with one holdfast prefix (a layer)", tc.args, code, tc.code, msg, tc.want)
				}
				t.Logf("%q: %s", tc.args, msg)
			}
		})
	}
}

// TestStoreUnreachable: a store that refuses connections ends lock, elect,
// elect --observe and status with 125 in well under a second on both
// stores, --timeout or not (etcd's client alone retries a refused port
// until its 5 s connect timeout: 5.05 s before failFastRefused); a silent
// one ends status and elect --observe with 125 at --timeout, the
// diagnosis (etcd: a TCP or TLS probe) included. Before, etcd's probe came
// after the timeout: 0.5 s late.
func TestStoreUnreachable(t *testing.T) {
	silent, refused := silentListener(t), refusedAddr(t)
	etcdAt := func(a string) []string { return []string{"--endpoints", a} }
	consulAt := func(a string) []string { return []string{"--backend", "consul", "--addr", a} }
	for _, tc := range []struct {
		name  string
		args  []string
		bound time.Duration
		why   string
	}{
		{"etcd/refused/lock", append(etcdAt(refused), "lock", "un", "--", "true"), time.Second, "connection refused"},
		{"etcd/refused/elect", append(etcdAt(refused), "elect", "--value", "v", "un", "--", "true"), time.Second, "connection refused"},
		{"etcd/refused/observe", append(etcdAt(refused), "elect", "--observe", "un"), time.Second, "connection refused"},
		{"etcd/refused/status", append(etcdAt(refused), "status", "un"), time.Second, "connection refused"},
		{"consul/refused/lock", append(consulAt(refused), "lock", "un", "--", "true"), time.Second, "connection refused"},
		{"consul/refused/observe", append(consulAt(refused), "elect", "--observe", "un"), time.Second, "connection refused"},
		{"consul/refused/status", append(consulAt(refused), "status", "un"), time.Second, "connection refused"},
		{"etcd/silent/status", append(etcdAt(silent), "status", "--timeout", "700ms", "un"), 700 * time.Millisecond, "did not answer within 700ms"},
		{"etcd/silent/observe", append(etcdAt(silent), "elect", "--observe", "--timeout", "700ms", "un"), 700 * time.Millisecond, "did not answer within 700ms"},
		{"consul/silent/status", append(consulAt(silent), "status", "--timeout", "700ms", "un"), 700 * time.Millisecond, "did not answer within 700ms"},
		{"consul/silent/observe", append(consulAt(silent), "elect", "--observe", "--timeout", "700ms", "un"), 700 * time.Millisecond, "did not answer within 700ms"},
		{"etcd/silent/elect", append(etcdAt(silent), "elect", "--value", "v", "--timeout", "700ms", "un", "--", "true"), 700 * time.Millisecond, "did not answer within 700ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := slices.IndexFunc(tc.args, func(a string) bool { return a == "lock" || a == "elect" || a == "status" })
			args := append(append([]string{tc.args[i]}, tc.args[:i]...), tc.args[i+1:]...)
			p := start(t, args...)
			code := p.wait(t, 30*time.Second)
			msg := p.stderr.String()
			t.Logf("exit %d after %v: %s", code, p.took.Round(time.Millisecond), strings.TrimSpace(msg))
			const slack = 300 * time.Millisecond // diagnose's probe included: it runs within the bound
			if code != exitFailed || p.took > tc.bound+slack || !strings.Contains(msg, tc.why) {
				t.Errorf("holdfast %q: exit %d after %v, want %d within %v; stderr lacks %q", args, code, p.took, exitFailed, tc.bound, tc.why)
			}
		})
	}
}

// TestElectNotElected: elect --try exits 124 at once when the election has
// a leader, and --timeout 124 when it elapses while campaigning (elect had
// neither flag), on both stores; nothing of the candidate is left.
func TestElectNotElected(t *testing.T) {
	e := etcdtest.Etcd(t)
	a := embedtest.Consul(t)
	for _, st := range []struct {
		name  string
		flags []string
	}{
		{"etcd", []string{"--endpoints", e.Endpoints()[0]}},
		{"consul", []string{"--backend", "consul", "--addr", a.HTTPAddr, "--lock-delay", "0"}},
	} {
		t.Run(st.name, func(t *testing.T) {
			ready := filepath.Join(t.TempDir(), "ready")
			leader := start(t, append(append([]string{"elect", "--value", "first"}, st.flags...), "ne/svc", "--", "sh", "-c", `touch "$0"; sleep 30`, ready)...)
			eventually(t, 20*time.Second, "the leader did not start", func() bool { _, err := os.Stat(ready); return err == nil })
			for _, tc := range []struct {
				args []string
				min  time.Duration
				max  time.Duration
				want string
			}{
				{[]string{"--try"}, 0, time.Second, "ne/svc: not acquired: has a leader (term "},
				{[]string{"--timeout", "700ms"}, 700 * time.Millisecond, 1500 * time.Millisecond, "ne/svc: not acquired: timed out waiting after 700ms"},
			} {
				p := start(t, append(append(append([]string{"elect", "--value", "second"}, tc.args...), st.flags...), "ne/svc", "--", "true")...)
				code := p.wait(t, 20*time.Second)
				t.Logf("elect %q: exit %d after %v", tc.args, code, p.took)
				if msg := p.stderr.String(); code != exitNotAcquired || p.took < tc.min || p.took > tc.max || !strings.Contains(msg, tc.want) {
					t.Errorf("elect %q: exit %d after %v, want %d within [%v, %v]; stderr %q lacks %q", tc.args, code, p.took, exitNotAcquired, tc.min, tc.max, msg, tc.want)
				}
			}
			began := time.Now()
			_ = leader.cmd.Process.Signal(syscall.SIGTERM)
			leader.wait(t, 20*time.Second)
			t.Logf("leader gone %v after SIGTERM", time.Since(began))
		})
	}
}
