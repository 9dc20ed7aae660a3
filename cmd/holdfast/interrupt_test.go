package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// TestInterruptStopsScript: Ctrl-C (SIGINT to the foreground process
// group: the script's shell and holdfast; holdfast passes it on to CMD)
// in a script running "holdfast lock ... -- CMD; echo continued": CMD
// dies of SIGINT, holdfast releases the lock and dies of SIGINT itself, so
// the shell stops the script, as it would had it run CMD itself. Also
// while holdfast waits for the lock. Before, holdfast exited 130 and the
// script went on. (etcdctl lock exits 255 and consul lock 0 there, and the
// script goes on.)
func TestInterruptStopsScript(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	for _, tc := range []struct{ name, cmd string }{
		{"running", "sleep 30"},
		{"waiting", "true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			name := "interrupt/" + tc.name
			if tc.name == "waiting" {
				holder := start(t, "lock", "-v", "--endpoints", e.Endpoints()[0], name, "--", "sleep", "30")
				eventually(t, 10*time.Second, "the holder did not acquire", func() bool { return strings.Contains(holder.stderr.String(), "acquired") })
			}
			script := filepath.Join(dir, "script")
			if err := os.WriteFile(script, []byte(`holdfast lock -v --endpoints `+e.Endpoints()[0]+` `+name+` -- `+tc.cmd+`; echo continued > "$1/continued"`+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			sh := exec.Command("bash", script, dir)
			sh.Env = append(os.Environ(), "PATH="+filepath.Dir(holdfastBin(t))+":"+os.Getenv("PATH"), "HOLDFAST_BACKEND=", "HOLDFAST_ENDPOINTS=", "ETCDCTL_ENDPOINTS=")
			var stderr syncBuffer
			sh.Stderr = &stderr
			sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the terminal's foreground group, as it were
			if err := sh.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = syscall.Kill(-sh.Process.Pid, syscall.SIGKILL) })
			want := "acquired"
			if tc.name == "waiting" {
				want = "waiting"
			}
			eventually(t, 10*time.Second, "holdfast did not "+want, func() bool { return strings.Contains(stderr.String(), want) })
			if err := syscall.Kill(-sh.Process.Pid, syscall.SIGINT); err != nil { // Ctrl-C
				t.Fatal(err)
			}
			waited := make(chan error, 1)
			go func() { waited <- sh.Wait() }()
			var err error
			select {
			case err = <-waited:
			case <-time.After(10 * time.Second):
				t.Fatalf("the script runs on 10 s after Ctrl-C; stderr: %s", stderr.String())
			}
			var ee *exec.ExitError
			signaled := errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled()
			_, cerr := os.Stat(filepath.Join(dir, "continued"))
			t.Logf("script: %v; stderr: %q", err, stderr.String())
			if cerr == nil || !signaled {
				t.Errorf("the script went on after Ctrl-C (continued: %v), or did not die of SIGINT (%v); stderr: %s", cerr == nil, err, stderr.String())
			}
			if keys := keysUnder(t, e.Client(t), name+"/"); tc.name == "running" && len(keys) != 0 {
				t.Errorf("keys %v left, want the lock released", keys)
			}
		})
	}
}
