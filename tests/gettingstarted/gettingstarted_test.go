// Package gettingstarted_test follows the README's "Getting started" word
// for word.
package gettingstarted_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/embedtest/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// TestGettingStarted runs the README's "Getting started" as a new user
// would, in a temporary directory: its first shell block (the clone being a
// link to this checkout: the one thing not run as written), the program
// saved where the README says, then its second shell block (go mod tidy, go
// run .) against a real etcd named by $ETCDCTL_ENDPOINTS, as the README
// allows. It checks what the comments promise: the require line that tidy
// adds, and the program's output, which the record in etcd confirms.
func TestGettingStarted(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Getting started\n")
	if !ok {
		t.Fatal("README.md has no Getting started section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	blocks := regexp.MustCompile("(?s)```(sh|go)\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) != 3 || blocks[0][1] != "sh" || blocks[1][1] != "go" || blocks[2][1] != "sh" {
		t.Fatalf("Getting started has %d code blocks, want sh (set up the module), go (the program), sh (tidy and run)", len(blocks))
	}
	setup, program, runIt := blocks[0][2], blocks[1][2], blocks[2][2]
	saveAs := regexp.MustCompile("Save this program as `([^`]+)`").FindStringSubmatch(section)
	if saveAs == nil {
		t.Fatal("Getting started does not say where to save the program")
	}
	require := regexp.MustCompile(`# adds: (require .*)`).FindStringSubmatch(runIt)
	prints := regexp.MustCompile(`# prints: (.*) N\n`).FindStringSubmatch(runIt)
	if require == nil || prints == nil {
		t.Fatalf("the second block does not say what tidy adds and what the program prints:\n%s", runIt)
	}

	checkout, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	clone := regexp.MustCompile(`(?m)^git clone <holdfast repository> (\S+)$`)
	if !clone.MatchString(setup) {
		t.Fatalf("the first block does not clone holdfast:\n%s", setup)
	}
	setup = clone.ReplaceAllString(setup, "ln -s '"+checkout+"' $1")

	e := etcdtest.Etcd(t)
	dir := t.TempDir()
	sh := func(script string) string {
		t.Helper()
		cmd := exec.Command("sh", "-e", "-x", "-c", script)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "GOTOOLCHAIN=local", "ETCDCTL_ENDPOINTS="+strings.Join(e.Endpoints(), ","))
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%v:\n%s\nstdout:\n%s\nstderr:\n%s", err, script, stdout.String(), stderr.String())
		}
		t.Logf("%s\n%s", stderr.String(), stdout.String())
		return stdout.String()
	}
	out := strings.Fields(sh(setup + "\npwd"))
	module := out[len(out)-1]
	if err := os.WriteFile(filepath.Join(dir, saveAs[1]), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	got := sh("cd '" + module + "'\n" + runIt)

	mod, err := os.ReadFile(filepath.Join(module, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Fields(require[1]); !regexp.MustCompile(`(?m)^\s*(require )?` + regexp.QuoteMeta(want[1]+" "+want[2]) + `$`).Match(mod) {
		t.Errorf("go.mod after the README's steps lacks %q:\n%s", require[1], mod)
	}
	line := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(prints[1]) + ` (\d+)$`).FindStringSubmatch(got)
	if line == nil {
		t.Fatalf("the program printed %q, want %q followed by a token", got, prints[1]+" N")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.Client(t).Get(ctx, "jobs/hello-record")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != line[0] {
		t.Errorf("etcd has %v under jobs/hello-record, want the program's record %q", resp.Kvs, line[0])
	}
	if resp, err := e.Client(t).Get(ctx, "jobs/hello/", clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the lock's keys after the program ended: %v, %v; want none", resp, err)
	}
}
