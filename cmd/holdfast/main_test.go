package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the demo in-process and checks its summary: no overlapping
// grants, the paused holder was told of its loss, and its stale write was
// rejected.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd and runs for about 5 s")
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	res, err := runDemo(ctx, &out, defaultDemo)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if res.Overlaps != 0 || res.StaleRejected != 1 || !res.ok() {
		t.Errorf("overlaps=%d stale_writes_rejected=%d, want 0 and 1", res.Overlaps, res.StaleRejected)
	}
	if !res.PausedLost {
		t.Error("the paused holder's grant context was not cancelled with ErrLost")
	}
	if res.Grants < defaultDemo.PauseGrant+1 || res.WritesOK != res.Grants {
		t.Errorf("grants=%d writes_ok=%d: want more than %d grants, each with an accepted write", res.Grants, res.WritesOK, defaultDemo.PauseGrant)
	}
	for _, want := range []string{"PAUSES", "told it lost the lock", "lease expired on the server", "stale write REJECTED", "unlock: ErrNotHeld",
		"summary: grants=" + strconv.Itoa(res.Grants) + " overlaps=0 stale_writes_rejected=1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// The paused holder must be told before the server expires its lease.
	s := out.String()
	if told, expired := strings.Index(s, "told it lost the lock"), strings.Index(s, "lease expired on the server"); told < 0 || expired < 0 || told > expired {
		t.Errorf("the holder was not told before the server expired its lease")
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("demo took %v, want < 15s", d)
	}
}

// TestUsage checks exit statuses and messages for bad command lines; none of
// these starts a server.
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "Available Commands:"},
		{[]string{"nope"}, 2, `unknown command "nope"`},
		{[]string{"help"}, 0, "bench"},
		{[]string{"help", "bench"}, 0, "-contenders"},
		{[]string{"help", "demo"}, 0, "holdfast demo"},
		{[]string{"help", "nope"}, 2, "unknown command"},
		{[]string{"help", "nope"}, 2, "lock        run a command"},
		{[]string{"bench", "-h"}, 0, "-scenario"},
		{[]string{"demo", "extra"}, 2, "no arguments"},
		{[]string{"bench", "--bogus"}, 2, "unknown flag: --bogus"},
		{[]string{"bench", "--backend", "redis"}, 2, "--backend must be etcd or consul"},
		{[]string{"bench", "--scenario", "x"}, 2, "--scenario must be"},
		{[]string{"bench", "--contenders", "8,x"}, 2, "--contenders"},
		{[]string{"bench", "--contenders", "0"}, 2, "--contenders"},
		{[]string{"bench", "--contenders", "1,,2"}, 2, "--contenders"},
		{[]string{"bench", "--lock-delays", "0,"}, 2, "lock-delay"},
		{[]string{"lock", "--endpoints", "a,,b", "x", "--", "true"}, 2, "none empty"},
		{[]string{"status", "--endpoints", ","}, 2, "exactly one NAME"},
		{[]string{"status", "--endpoints", ",", "x"}, 2, "none empty"},
		{[]string{"lock", "x", "true", "-rf"}, 2, "unknown shorthand flag"},
		{[]string{"bench", "--duration", "0s"}, 2, "--duration must be positive"},
		{[]string{"bench", "--duration", "soon"}, 2, `invalid argument "soon"`},
		{[]string{"bench", "--hold", "-3"}, 2, "--hold"},
		{[]string{"bench", "--ttl", "1500ms"}, 2, "--ttl"},
		{[]string{"bench", "--backend", "consul", "--ttl", "5s"}, 2, "--ttl"},
		{[]string{"bench", "--lock-delays", "0,2m"}, 2, "lock-delay"},
		{[]string{"bench", "--endpoints", "x", "--backend", "consul"}, 2, "--endpoints is for"},
		{[]string{"bench", "extra"}, 2, "unexpected arguments"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, tc.args)
		got := stdout.String() + stderr.String()
		if code != tc.code || !strings.Contains(got, tc.want) {
			t.Errorf("holdfast %s: exit %d, want %d; output lacks %q:\n%s", strings.Join(tc.args, " "), code, tc.code, tc.want, got)
		}
	}
}

// TestCompletion: cobra's shell completion scripts, and completion of the
// command names.
func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, []string{"completion", shell}); code != 0 || !strings.Contains(stdout.String(), "holdfast") {
			t.Errorf("completion %s: exit %d, %d bytes; stderr %s", shell, code, stdout.Len(), stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, []string{"__complete", "lo"})
	if !strings.Contains(stdout.String(), "lock") {
		t.Errorf("completing \"lo\": %q, want lock", stdout.String())
	}
}

// TestEnvDefaults: the store flags default to the natives' variables.
func TestEnvDefaults(t *testing.T) {
	t.Setenv("HOLDFAST_ENDPOINTS", "")
	t.Setenv("ETCDCTL_ENDPOINTS", "10.1.2.3:2379")
	t.Setenv("CONSUL_HTTP_ADDR", "10.1.2.4:8500")
	t.Setenv("HOLDFAST_BACKEND", "consul")
	var stdout, stderr bytes.Buffer
	run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, []string{"lock", "--help"})
	for _, want := range []string{`(default "10.1.2.3:2379")`, `(default "10.1.2.4:8500")`, `(default "consul")`} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("lock --help lacks %s", want)
		}
	}
	t.Setenv("HOLDFAST_ENDPOINTS", "10.9.9.9:2379")
	stdout.Reset()
	run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, []string{"lock", "--help"})
	if !strings.Contains(stdout.String(), `(default "10.9.9.9:2379")`) {
		t.Error("HOLDFAST_ENDPOINTS does not take precedence over ETCDCTL_ENDPOINTS")
	}
}
