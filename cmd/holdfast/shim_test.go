package main

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// startShim starts argv as a shim (not let go yet) in its own process
// group, and kills that group when the test ends.
func startShim(t *testing.T, argv ...string) (*exec.Cmd, *shimStart) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s, ends, err := asShim(cmd)
	if err != nil {
		t.Fatal(err)
	}
	err = cmd.Start()
	closeAll(ends)
	if err != nil {
		s.abandon()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return cmd, s
}

// TestShimGate: CMD started as a shim does not run before it is let go
// (holdfast has not yet told the guard its group); let go, it runs in the
// shim's process (same pid, so the group the guard knows), without the
// shim's variable or descriptors; and a shim whose gate ends without a go
// (holdfast died) exits without running CMD.
func TestShimGate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ran := filepath.Join(dir, "ran")
	script := `s=$$; [ -n "${` + shimEnv + `+x}" ] && s="$s env"; for fd in 3 4 5; do [ -e /proc/$$/fd/$fd ] && s="$s fd$fd"; done; echo "$s" > "$1"; sleep 600`
	cmd, s := startShim(t, "sh", "-c", script, "sh", ran)
	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("CMD ran before the shim was let go")
	}
	s.letGo()
	var got string
	eventually(t, 10*time.Second, "CMD did not run once let go", func() bool {
		b, err := os.ReadFile(ran)
		got = strings.TrimSpace(string(b))
		return err == nil && strings.HasSuffix(string(b), "\n")
	})
	if want := strconv.Itoa(cmd.Process.Pid); got != want {
		t.Errorf("CMD wrote %q: want %q (its pid the shim's, no %s in its environment, no descriptor past 2)", got, want, shimEnv)
	}

	gone := filepath.Join(dir, "gone")
	cmd, s = startShim(t, "sh", "-c", `echo ran > "$1"`, "sh", gone)
	s.abandon()
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitNotFound {
		t.Errorf("an abandoned shim ended with %v: want exit %d", err, exitNotFound)
	}
	if _, err := os.Stat(gone); err == nil {
		t.Error("an abandoned shim ran CMD")
	}
}

// TestShimExecFails: an exec that fails in the shim is execErr's error, as
// exec.Cmd.Start gives it (so that holdfast exits 126 or 127 as before).
func TestShimExecFails(t *testing.T) {
	t.Parallel()
	f := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, s := startShim(t, f)
	s.letGo()
	err := s.execErr()
	var pe *os.PathError
	if !errors.As(err, &pe) || pe.Op != "fork/exec" || pe.Path != f || !errors.Is(err, fs.ErrPermission) {
		t.Errorf("execErr: %v: want fork/exec %s: permission denied", err, f)
	}
	_ = cmd.Wait()
}

// TestCommandProcessState: CMD under `holdfast lock` starts as it would
// from the test itself, though holdfast's own Go runtime (the shim) ran in
// its process first: the same blocked and ignored signals and the same
// open-files limit.
func TestCommandProcessState(t *testing.T) {
	e := etcdtest.Etcd(t)
	argv := []string{"cat", "/proc/self/status", "/proc/self/limits"}
	pick := func(out string) string {
		var keep []string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "SigBlk:") || strings.HasPrefix(l, "SigIgn:") || strings.HasPrefix(l, "Max open files") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	out, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := pick(string(out))
	p := start(t, append([]string{"lock", "--endpoints", e.Endpoints()[0], "shim/state", "--"}, argv...)...)
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("holdfast lock: exit %d; stderr: %s", code, p.stderr.String())
	}
	if got := pick(p.stdout.String()); got != want || strings.Count(want, "\n") != 2 {
		t.Errorf("CMD under holdfast:\n%s\nwant, as started directly:\n%s", got, want)
	}
}

// TestShimStoppedBeforeExec: letGo does not wait for the exec, so a shim
// stopped before it (Ctrl-Z at CMD's start) does not hold holdfast up
// (which must go on feeding the guard and following job control); CMD runs
// once the shim is continued.
func TestShimStoppedBeforeExec(t *testing.T) {
	t.Parallel()
	ran := filepath.Join(t.TempDir(), "ran")
	cmd, s := startShim(t, "sh", "-c", `echo ran > "$1"; sleep 600`, "sh", ran)
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	returned := make(chan struct{})
	go func() { s.letGo(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(2 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
		t.Fatal("letGo waited for a stopped shim's exec")
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("CMD ran while its shim was stopped")
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := s.execErr(); err != nil {
		t.Fatalf("execErr: %v", err)
	}
	eventually(t, 10*time.Second, "CMD did not run once its shim was continued", func() bool { _, err := os.Stat(ran); return err == nil })
}
