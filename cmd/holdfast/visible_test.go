package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	hfconsul "github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

// TestVerbose: with -v, lock says on stderr where it waits, the token it
// got and that it released, on both stores; without -v it says nothing.
func TestVerbose(t *testing.T) {
	e := etcdtest.Etcd(t)
	a := embedtest.Consul(t)
	for _, st := range []struct {
		name    string
		flags   []string
		waiters func(t *testing.T) int
	}{
		{"etcd", []string{"--endpoints", e.Endpoints()[0]}, func(t *testing.T) int {
			s, err := hfetcd.Inspect(context.Background(), e.Client(t), "verbose")
			if err != nil {
				t.Fatal(err)
			}
			return len(s.Waiters)
		}},
		{"consul", []string{"--backend", "consul", "--addr", a.HTTPAddr, "--lock-delay", "0"}, func(t *testing.T) int {
			s, err := hfconsul.Inspect(context.Background(), a.Client(t), "verbose")
			if err != nil {
				t.Fatal(err)
			}
			return len(s.Waiters)
		}},
	} {
		t.Run(st.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("DIR", dir)
			holder := start(t, append(append([]string{"lock"}, st.flags...), "verbose", "--", "sh", "-c", `touch "$DIR/ready"; while [ ! -e "$DIR/release" ]; do sleep 0.02; done`)...)
			eventually(t, 30*time.Second, "the holder did not start", func() bool { _, err := os.Stat(filepath.Join(dir, "ready")); return err == nil })
			quiet := start(t, append(append([]string{"lock"}, st.flags...), "verbose", "--", "true")...)
			eventually(t, 10*time.Second, "the quiet waiter did not queue", func() bool { return st.waiters(t) == 1 })
			p := start(t, append(append([]string{"lock", "-v"}, st.flags...), "verbose", "--", "true")...)
			eventually(t, 10*time.Second, "-v did not say where it waits: "+p.stderr.String(), func() bool {
				return strings.Contains(p.stderr.String(), "holdfast: verbose: waiting behind 2 (1 holding, 1 waiting ahead)")
			})
			if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, q := range []*proc{holder, quiet, p} {
				if code := q.wait(t, 30*time.Second); code != 0 {
					t.Fatalf("exit %d; stderr: %s", code, q.stderr.String())
				}
			}
			msg := p.stderr.String()
			t.Logf("lock -v said:\n%s", msg)
			m := regexp.MustCompile(`holdfast: verbose: acquired the lock, token (\d+), after \S+\n`).FindStringSubmatch(msg)
			if m == nil || !strings.Contains(msg, "holdfast: verbose: released the lock, token "+m[1]+"\n") {
				t.Errorf("-v stderr lacks acquired and released with the token:\n%s", msg)
			}
			if s := holder.stderr.String() + quiet.stderr.String(); s != "" {
				t.Errorf("without -v, lock said: %s", s)
			}
		})
	}
}

// TestMetricsAndLogs: a long-running lock serves its Prometheus metrics on
// --metrics-addr and logs the session's events with --log json.
func TestMetricsAndLogs(t *testing.T) {
	e := etcdtest.Etcd(t)
	ports, err := embedtest.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	dir := t.TempDir()
	t.Setenv("DIR", dir)
	p := start(t, "lock", "--endpoints", e.Endpoints()[0], "--metrics-addr", addr, "--log", "json", "obs", "--",
		"sh", "-c", `touch "$DIR/ready"; while [ ! -e "$DIR/release" ]; do sleep 0.02; done`)
	eventually(t, 30*time.Second, "the command did not start", func() bool { _, err := os.Stat(filepath.Join(dir, "ready")); return err == nil })
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"holdfast_holders 1", "holdfast_acquire_wait_seconds_count 1", `holdfast_grants_lost_total{cause="lost"} 0`} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, p.stderr.String())
	}
	var grants int
	for _, l := range strings.Split(strings.TrimSpace(p.stderr.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Errorf("--log json wrote a line that is not JSON: %q", l)
			continue
		}
		if rec["store"] == "etcd" && rec["name"] == "obs" {
			grants++
		}
	}
	if grants == 0 {
		t.Errorf("--log json logged no event of obs on etcd:\n%s", p.stderr.String())
	}
	if _, err := http.Get("http://" + addr + "/metrics"); err == nil {
		t.Error("the metrics server still answers after holdfast exited")
	}
}
