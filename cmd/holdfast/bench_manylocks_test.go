package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestManyLocksUsage: bad --locks values are usage errors, reported before
// any server starts.
func TestManyLocksUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--scenario", "many-locks", "--locks", "0"}, "--locks"},
		{[]string{"bench", "--scenario", "many-locks", "--locks", "10,x"}, "--locks"},
		{[]string{"bench", "--scenario", "many-locks", "--locks", "1,,2"}, "--locks"},
		{[]string{"bench", "--scenario", "many-locks", "--locks", "100001"}, "locks must be between 1 and 100000"},
		{[]string{"bench", "--scenario", "many-locks", "--backend", "consul", "--ttl", "5s"}, "--ttl"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, tc.args)
		got := stdout.String() + stderr.String()
		if code != 2 || !strings.Contains(got, tc.want) || strings.Contains(got, "starting") {
			t.Errorf("holdfast %s: exit %d, want 2 before starting a server; output lacks %q:\n%s", strings.Join(tc.args, " "), code, tc.want, got)
		}
	}
}

// TestManyLocksCommand runs `holdfast bench --scenario many-locks --json`
// with 50 locks on an embedded etcd and checks its JSON rows.
func TestManyLocksCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr},
		[]string{"bench", "--scenario", "many-locks", "--locks", "50", "--ttl", "2s", "--duration", "1s", "--json"})
	if code != 0 {
		t.Fatalf("exit %d:\n%s\n%s", code, stdout.String(), stderr.String())
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var r struct {
			Scenario, Backend, Impl string
			Locks                   int
			Errors, Lost            int
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if r.Scenario != "many-locks" || r.Backend != "etcd" || r.Errors != 0 || r.Lost != 0 {
			t.Errorf("row %s", line)
		}
		got = append(got, fmt.Sprintf("%s %d", r.Impl, r.Locks))
	}
	want := []string{"holdfast 0", "holdfast 50", "native 0", "native 50"}
	if !slices.Equal(got, want) {
		t.Errorf("rows %v, want %v (impl, locks)", got, want)
	}
}
