package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest"
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

// TestLockMultiVerbose: with -v, "lock --and acct/a acct/b" says it waits
// on acct/a (taken first, held elsewhere), not on NAME (before: "acct/b:
// waiting behind 1"); "acquired" names every name's token; CMD gets
// HOLDFAST_NAME_<i>, HOLDFAST_KEY_<i> and HOLDFAST_TOKEN_<i> per name in
// command-line order (a repeated name at each of its positions: before,
// its second one was dropped and the later indexes shifted), and
// HOLDFAST_TOKEN is still NAME's.
func TestLockMultiVerbose(t *testing.T) {
	e := etcdtest.Etcd(t)
	a := embedtest.Consul(t)
	for _, st := range []struct {
		name  string
		flags []string
	}{
		{"etcd", []string{"--endpoints", e.Endpoints()[0]}},
		{"consul", []string{"--backend", "consul", "--addr", a.HTTPAddr, "--lock-delay", "0"}},
	} {
		t.Run(st.name, func(t *testing.T) { lockMultiVerbose(t, st.flags) })
	}
}

func lockMultiVerbose(t *testing.T, flags []string) {
	dir := t.TempDir()
	ready, release := filepath.Join(dir, "ready"), filepath.Join(dir, "release")
	holder := start(t, append(append([]string{"lock"}, flags...), "acct/a", "--", "sh", "-c", `touch "$0"; while [ ! -e "$1" ]; do sleep 0.05; done`, ready, release)...)
	eventually(t, 20*time.Second, "the holder of acct/a did not start", func() bool { _, err := os.Stat(ready); return err == nil })
	p := start(t, append(append([]string{"lock", "-v"}, flags...), "--and", "acct/a", "--and", "acct/b", "acct/b", "--", "sh", "-c",
		`echo "$HOLDFAST_TOKEN $HOLDFAST_NAME_1 $HOLDFAST_TOKEN_1 $HOLDFAST_KEY_1 $HOLDFAST_NAME_2 $HOLDFAST_TOKEN_2 $HOLDFAST_KEY_2 $HOLDFAST_NAME_3 $HOLDFAST_TOKEN_3 $HOLDFAST_KEY_3 $HOLDFAST_NAME_4"`)...)
	eventually(t, 20*time.Second, "lock -v did not say where it waits", func() bool { return strings.Contains(p.stderr.String(), "waiting behind") })
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := holder.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("holder: exit %d: %s", code, holder.stderr.String())
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d: %s", code, p.stderr.String())
	}
	msg := p.stderr.String()
	if !strings.Contains(msg, "holdfast: acct/a: waiting behind 1 (1 holding, 0 waiting ahead)") || strings.Contains(msg, "acct/b: waiting") {
		t.Errorf("stderr %q: want it to wait on acct/a, behind 1", msg)
	}
	f := strings.Fields(p.stdout.String())
	if len(f) != 10 || f[1] != "acct/b" || f[4] != "acct/a" || f[0] != f[2] || !strings.HasPrefix(f[3], "acct/b/") || !strings.HasPrefix(f[6], "acct/a/") ||
		!slices.Equal(f[7:10], f[1:4]) {
		t.Fatalf("CMD saw %q: want NAME's token, then acct/b's name, token and key (_1), acct/a's (_2), acct/b's again (_3: the name given twice, at its second position), and no _4", f)
	}
	if want := regexp.MustCompile(`holdfast: acct/b: acquired the lock, tokens acct/b ` + f[2] + `, acct/a ` + f[5] + `, after \S+\n`); !want.MatchString(msg) {
		t.Errorf("stderr %q lacks a line matching %s", msg, want)
	}
	if !strings.Contains(msg, "released the lock, tokens acct/b "+f[2]+", acct/a "+f[5]) {
		t.Errorf("stderr %q does not say every token released", msg)
	}
}
