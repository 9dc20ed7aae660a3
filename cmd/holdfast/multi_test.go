package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// TestLockMulti: "lock --and" takes several names as one grant. Four
// processes lock {acct/x, acct/y}, two passing them in each order, and run
// at once: none deadlocks, their commands never overlap, and each sees
// HOLDFAST_NAMES sorted, HOLDFAST_TOKENS one token per name, and
// HOLDFAST_TOKEN the token of its NAME. Nothing is left afterwards.
func TestLockMulti(t *testing.T) {
	e := etcdtest.Etcd(t)
	ep := e.Endpoints()[0]
	c := e.Client(t)
	log := filepath.Join(t.TempDir(), "log")
	t.Setenv("LOG", log)
	script := `echo "start $HOLDFAST_NAME $HOLDFAST_TOKEN $HOLDFAST_NAMES $HOLDFAST_TOKENS" >> "$LOG"; sleep 0.2; echo end >> "$LOG"`
	var procs []*proc
	for i := range 4 {
		name, also := "acct/x", "acct/y"
		if i%2 == 1 {
			name, also = also, name
		}
		procs = append(procs, start(t, "lock", "--endpoints", ep, "--and", also, name, "--", "sh", "-c", script))
	}
	for i, p := range procs {
		if code := p.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("process %d: exit %d; stderr: %s", i, code, p.stderr.String())
		}
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 8 {
		t.Fatalf("log:\n%s\nwant 4 start/end pairs", data)
	}
	for i := 0; i < len(lines); i += 2 {
		f := strings.Fields(lines[i])
		if len(f) != 5 || f[0] != "start" || lines[i+1] != "end" {
			t.Fatalf("log:\n%s\nwant start/end pairs that never interleave", data)
		}
		name, token, names, tokens := f[1], f[2], f[3], strings.Split(f[4], ",")
		if names != "acct/x,acct/y" || len(tokens) != 2 {
			t.Errorf("HOLDFAST_NAMES=%q HOLDFAST_TOKENS=%q: want acct/x,acct/y and two tokens", names, f[4])
			continue
		}
		if want := tokens[strings.Index(names, name)/len("acct/x,")]; token != want {
			t.Errorf("HOLDFAST_TOKEN=%s for %s, want its token %s (of %v)", token, name, want, tokens)
		}
	}
	if keys := keysUnder(t, c, "acct/"); len(keys) != 0 {
		t.Errorf("keys left: %v", keys)
	}
}
