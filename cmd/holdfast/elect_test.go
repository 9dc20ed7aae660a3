package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// observer runs holdfast elect --observe --json and delivers what it prints.
func observer(t *testing.T, args ...string) <-chan observation {
	t.Helper()
	cmd := exec.Command(holdfastBin(t), append([]string{"elect", "--observe", "--json"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ch := make(chan observation, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var o observation
			if json.Unmarshal(sc.Bytes(), &o) == nil {
				ch <- o
			}
		}
	}()
	return ch
}

func nextObservation(t *testing.T, ch <-chan observation) observation {
	t.Helper()
	select {
	case o, ok := <-ch:
		if !ok {
			t.Fatal("elect --observe stopped")
		}
		return o
	case <-time.After(20 * time.Second):
		t.Fatal("elect --observe printed nothing within 20 s")
		return observation{}
	}
}

// TestElectEtcd: holdfast elect runs the command while leader with the
// term in its environment; a native concurrency.Election candidate waits
// behind it and wins when it resigns; --observe prints every leader in
// order, "no leader" included; a revoked lease stops the command (122), and
// with --loop holdfast campaigns again and reruns it.
func TestElectEtcd(t *testing.T) {
	e := etcdtest.Etcd(t)
	ep := e.Endpoints()[0]
	c := e.Client(t)
	obs := observer(t, "--endpoints", ep, "svc/leader")
	if o := nextObservation(t, obs); !o.None {
		t.Fatalf("first observation %+v, want no leader", o)
	}

	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	t.Setenv("RELEASE", release)
	script := `echo "$HOLDFAST_VALUE|$HOLDFAST_TOKEN|$HOLDFAST_KEY"; while [ ! -e "$RELEASE" ]; do sleep 0.05; done`
	p := start(t, "elect", "--endpoints", ep, "svc/leader", "--value", "node-a", "--", "sh", "-c", script)
	o := nextObservation(t, obs)
	eventually(t, 20*time.Second, "the command did not start", func() bool { return strings.Contains(p.stdout.String(), "|") })
	f := strings.Split(strings.TrimSpace(p.stdout.String()), "|")
	if f[0] != "node-a" || o.Value != "node-a" || strconv.FormatUint(o.Term, 10) != f[1] || o.Key != f[2] {
		t.Fatalf("command saw %q; observer saw %+v: want the same leader node-a", f, o)
	}

	// A native candidate queues behind holdfast's leader.
	ns, err := concurrency.NewSession(c, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	native := concurrency.NewElection(ns, "svc/leader")
	won := make(chan error, 1)
	go func() { won <- native.Campaign(context.Background(), "native-b") }()
	select {
	case err := <-won:
		t.Fatalf("the native candidate won (%v) while holdfast led", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr %s", code, p.stderr.String())
	}
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	if o := nextObservation(t, obs); o.Value != "native-b" || o.Term == 0 {
		t.Fatalf("after holdfast resigned: %+v, want native-b leading", o)
	}
	if err := native.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	if o := nextObservation(t, obs); !o.None {
		t.Fatalf("after the native leader resigned: %+v, want no leader", o)
	}

	// --loop: a lost leadership stops the command; holdfast campaigns again.
	_ = os.Remove(release)
	p = start(t, "elect", "--endpoints", ep, "--loop", "svc/leader", "--value", "node-c", "--", "sh", "-c", script)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("elect --loop stdout: %s\nstderr: %s", p.stdout.String(), p.stderr.String())
		}
	})
	first := nextObservation(t, obs)
	lease := func(key string) clientv3.LeaseID {
		id, err := strconv.ParseInt(key[strings.LastIndex(key, "/")+1:], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		return clientv3.LeaseID(id)
	}
	if _, err := c.Revoke(context.Background(), lease(first.Key)); err != nil {
		t.Fatal(err)
	}
	var second observation
	for second = nextObservation(t, obs); second.None; second = nextObservation(t, obs) {
	}
	if second.Value != "node-c" || second.Term <= first.Term {
		t.Fatalf("after the revoke: %+v, want node-c leading again with a term above %d", second, first.Term)
	}
	eventually(t, 20*time.Second, "the command did not run again", func() bool { return strings.Count(p.stdout.String(), "|") >= 4 })
	if !strings.Contains(p.stderr.String(), "campaigning again") {
		t.Errorf("stderr does not say it campaigns again: %s", p.stderr.String())
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr %s", code, p.stderr.String())
	}
}

// TestElectConsul: on Consul the leader's value is the lock key's value,
// and `consul lock` on the same name cannot take it while holdfast leads.
func TestElectConsul(t *testing.T) {
	a := embedtest.Consul(t)
	bin, err := embedtest.ConsulBinary()
	if err != nil {
		t.Fatal(err)
	}
	obs := observer(t, "--backend", "consul", "--addr", a.HTTPAddr, "svc/leader")
	if o := nextObservation(t, obs); !o.None {
		t.Fatalf("first observation %+v, want no leader", o)
	}
	release := filepath.Join(t.TempDir(), "release")
	t.Setenv("RELEASE", release)
	p := start(t, "elect", "--backend", "consul", "--addr", a.HTTPAddr, "svc/leader", "--value", "node-a", "--",
		"sh", "-c", `echo "$HOLDFAST_TOKEN"; while [ ! -e "$RELEASE" ]; do sleep 0.05; done`)
	o := nextObservation(t, obs)
	eventually(t, 20*time.Second, "the command did not start", func() bool { return strings.TrimSpace(p.stdout.String()) != "" })
	if o.Value != "node-a" || strconv.FormatUint(o.Term, 10) != strings.TrimSpace(p.stdout.String()) {
		t.Fatalf("observer saw %+v, command saw term %s", o, p.stdout.String())
	}
	pair, _, err := a.Client(t).KV().Get("svc/leader/.lock", nil)
	if err != nil || pair == nil || string(pair.Value) != "node-a" || pair.Session == "" {
		t.Fatalf("lock key %+v, %v: want held with value node-a", pair, err)
	}
	if out, err := exec.Command(bin, "lock", "-http-addr="+a.HTTPAddr, "-try=300ms", "svc/leader", "true").CombinedOutput(); err == nil {
		t.Errorf("consul lock took the election's key while holdfast led: %s", out)
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr %s", code, p.stderr.String())
	}
	if o := nextObservation(t, obs); !o.None {
		t.Fatalf("after resigning: %+v, want no leader", o)
	}
}

func TestElectUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"elect", "svc", "--", "true"}, "--value is required"},
		{[]string{"elect", "--observe"}, "exactly one NAME"},
		{[]string{"elect", "--observe", "svc", "--", "true"}, "exactly one NAME"},
		{[]string{"elect", "/svc", "--value", "v", "--", "true"}, "invalid name"},
		{[]string{"elect", "svc", "--value", "v"}, "missing the command"},
		{[]string{"elect", "--observe", "--value", "v", "svc"}, "--value applies to campaigning only"},
		{[]string{"elect", "--observe", "--loop", "svc"}, "--loop applies to campaigning only"},
		{[]string{"elect", "--observe", "--kill-grace", "1s", "svc"}, "--kill-grace applies to campaigning only"},
		{[]string{"elect", "--observe", "--child-exit-code=false", "svc"}, "--child-exit-code applies to campaigning only"},
		{[]string{"elect", "--json", "--value", "v", "svc", "--", "true"}, "--json applies to --observe only"},
	} {
		var stdout, stderr strings.Builder
		code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, tc.args)
		if got := stderr.String(); code != 2 || !strings.Contains(got, tc.want) {
			t.Errorf("holdfast %s: exit %d, want 2; stderr lacks %q:\n%s", strings.Join(tc.args, " "), code, tc.want, got)
		}
	}
}
