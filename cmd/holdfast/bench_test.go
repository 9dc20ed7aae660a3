package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestBenchUsage: the bench flags of the floor, waiters, nodes and quick
// work are checked before any server starts.
func TestBenchUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--nodes", "2"}, "--nodes must be 1 or 3"},
		{[]string{"bench", "--nodes", "3", "--backend", "consul"}, "--nodes is for the embedded etcd"},
		{[]string{"bench", "--nodes", "3", "--endpoints", "127.0.0.1:1"}, "--nodes is for the embedded etcd"},
		{[]string{"bench", "--waiters", "2,x"}, "--waiters"},
		{[]string{"bench", "--waiters", "1024"}, "waiters must be between 1 and 1023"},
		{[]string{"bench", "--rounds", "0"}, "--rounds must be between 1 and 100"},
		{[]string{"bench", "--scenario", "wait"}, "--scenario must be one of lock, handoff, takeover, election, semaphore, waiters"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, tc.args)
		if got := stdout.String() + stderr.String(); code != 2 || !strings.Contains(got, tc.want) {
			t.Errorf("holdfast %s: exit %d, want 2; output lacks %q:\n%s", strings.Join(tc.args, " "), code, tc.want, got)
		}
	}
	var stdout, stderr bytes.Buffer
	run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, []string{"help", "bench"})
	for _, want := range []string{"--quick", "--waiters", "--nodes", "--rounds", "floor", "of_floor"} {
		if !strings.Contains(stdout.String()+stderr.String(), want) {
			t.Errorf("help bench lacks %q", want)
		}
	}
}

// TestBenchQuickJSON runs `holdfast bench --quick --scenario lock --json` on
// an embedded etcd and checks the JSON lines: a holdfast, a native and a
// floor row per contender count, of_floor on the first two, no violation or
// error, and the ratio objects. (internal/bench's TestQuick runs every
// scenario on both stores.)
func TestBenchQuickJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if code := run(ctx, &env{stdout: &stdout, stderr: &stderr}, []string{"bench", "--quick", "--scenario", "lock", "--contenders", "2", "--json"}); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	var impls []string
	ratios := 0
	for line := range strings.Lines(stdout.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if q, ok := m["ratio"].(map[string]any); ok {
			ratios++
			if q["holdfast_of_floor"] == nil || q["native_of_floor"] == nil {
				t.Errorf("ratio without of_floor: %s", line)
			}
			continue
		}
		impl, _ := m["impl"].(string)
		impls = append(impls, impl)
		if m["violations"] != 0.0 || m["errors"] != 0.0 || m["scenario"] != "lock" || m["contenders"] != 2.0 || m["rounds"] != 3.0 || m["nodes"] != 1.0 {
			t.Errorf("row %s", line)
		}
		if _, ok := m["of_floor"]; !ok || (m["of_floor"] == nil) != (impl == "floor") {
			t.Errorf("of_floor: want a number on every row but the floor's: %s", line)
		}
	}
	if strings.Join(impls, ",") != "holdfast,native,floor" || ratios != 1 {
		t.Errorf("rows %v and %d ratios, want holdfast,native,floor and 1", impls, ratios)
	}
}
