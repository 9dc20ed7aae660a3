package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestSoakUsage: bad soak command lines exit 2 with a message, before any
// server starts.
func TestSoakUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"soak", "extra"}, "soak takes no arguments"},
		{[]string{"soak", "--duration", "0s"}, "--duration must be positive"},
		{[]string{"soak", "--clients", "1"}, "--clients must be at least 2"},
		{[]string{"soak", "--backend", "redis"}, `--backend "redis"`},
		{[]string{"soak", "--primitive", "rwmutex"}, `--primitive "rwmutex": want mutex, semaphore, election, multi, shard or all`},
		{[]string{"soak", "--faults", "kill-leader"}, `--faults "kill-leader": want none, or some of stop-follower,`},
		{[]string{"soak", "--backend", "consul", "--faults", "none,kill-leader"}, `--faults "none,kill-leader": want none, or some of kill-leader,`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, tc.args)
		if got := stdout.String() + stderr.String(); code != 2 || !strings.Contains(got, tc.want) {
			t.Errorf("holdfast %s: exit %d, want 2; output lacks %q:\n%s", strings.Join(tc.args, " "), code, tc.want, got)
		}
	}
}

// TestSoakAllPrimitives: a short soak of the three primitives in turn on
// etcd prints a passing summary for each, with every figure the summary
// promises.
func TestSoakAllPrimitives(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, []string{"soak", "--backend", "etcd", "--primitive", "all", "--duration", "5s"})
	out := stdout.String()
	t.Logf("\n%s%s", out, stderr.String())
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, p := range []string{"mutex", "semaphore", "election"} {
		if !strings.Contains(out, "backend: etcd (3 members), "+p+", 5s") {
			t.Errorf("no summary of the %s", p)
		}
	}
	for _, want := range []string{"faults injected: ", "fenced writes: accepted=", "violations: fence=0 told_first=0", "linearizable=Ok keys_left=0", "grants a fault ended: ", "worst fault-to-notice: ", "worst takeover: "} {
		if n := strings.Count(out, want); n != 3 {
			t.Errorf("%q appears %d times, want 3 (one per primitive)", want, n)
		}
	}
}

// TestSoakNoFaults: --faults none runs the scenario without a fault, the
// baseline for grants per minute.
func TestSoakNoFaults(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, []string{"soak", "--backend", "etcd", "--faults", "none", "--duration", "3s"})
	out := stdout.String()
	t.Logf("\n%s%s", out, stderr.String())
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(out, "faults injected: none") || strings.Contains(out, "grants=0 ") {
		t.Errorf("want a summary with grants and no fault injected")
	}
}
