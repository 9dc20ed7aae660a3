package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/leakcheck"
)

// TestMain fails the package if the example leaves a goroutine running once
// the tests are done.
func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// runLock runs the example in-process, bounded, and checks its steps. It
// returns T2, the token of holdfast's second grant.
func runLock(t *testing.T, args ...string) (string, uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var buf bytes.Buffer
	err := run(ctx, &buf, args)
	out := buf.String()
	t.Logf("consul-lock %s:\n%s", strings.Join(args, " "), out)
	if err != nil {
		t.Fatalf("run: %v", err)
	}

	steps := []string{
		`holdfast: locked examples/consul-lock/\.lock \(token T1 = (\d+)\)`,
		`api\.Lock: try-once failed: holdfast holds the lock`,
		`holdfast: unlocked`,
		`api\.Lock: locked`,
		`holdfast: still waiting after 300 ms: api\.Lock holds the lock`,
		`api\.Lock: unlocked`,
		`holdfast: locked again \(token T2 = (\d+); T2 > T1: true\)`,
		`holdfast: guarded write while holding the lock: ok`,
		`holdfast: unlocked`,
		`holdfast: guarded write after Unlock refused: .*holdfast: grant not held.*`,
	}
	// The steps, in this order, at the end of the output.
	want := regexp.MustCompile(`(?m)^` + strings.Join(steps, `\n`) + `\n\z`)
	m := want.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("output does not end with the steps:\n%s", strings.Join(steps, "\n"))
	}
	t1, _ := strconv.ParseUint(m[1], 10, 64)
	t2, _ := strconv.ParseUint(m[2], 10, 64)
	if t1 == 0 || t2 <= t1 {
		t.Errorf("tokens T1 = %d, T2 = %d: want 0 < T1 < T2", t1, t2)
	}
	return out, t2
}

func TestDevAgent(t *testing.T) {
	out, _ := runLock(t)
	if !regexp.MustCompile(`^no -addr: starting .*embedtest\.StartConsul.*\nConsul dev agent at 127\.0\.0\.1:\d+\n`).MatchString(out) {
		t.Errorf("output does not start by saying it starts a dev agent")
	}
}

// TestAddr runs the example against an agent of the test's and checks what
// it leaves in Consul: the guarded write, a free lock, no session.
func TestAddr(t *testing.T) {
	agent := embedtest.Consul(t)
	out, t2 := runLock(t, "-addr", agent.HTTPAddr)
	if strings.Contains(out, "dev agent") {
		t.Errorf("started its own agent despite -addr")
	}
	client := agent.Client(t)
	data, _, err := client.KV().Get(dataKey, nil)
	if err != nil || data == nil || string(data.Value) != "written under token "+strconv.FormatUint(t2, 10) {
		t.Errorf("%s = %+v (err %v), want the guarded write under token %d", dataKey, data, err, t2)
	}
	lock, _, err := client.KV().Get(consul.LockKey(name), nil)
	if err != nil || lock != nil && lock.Session != "" {
		t.Errorf("lock key %+v (err %v): want it free (holdfast's Unlock deletes it)", lock, err)
	}
	// Every session is destroyed; api.Lock destroys its own in the background.
	deadline := time.Now().Add(5 * time.Second)
	for {
		sessions, _, err := client.Session().List(nil)
		if err == nil && len(sessions) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sessions left: %d (err %v)", len(sessions), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
