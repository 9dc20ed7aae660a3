//go:build holdfast_testhooks

package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

// TestSignalBeforeExec: a signal passed on as CMD starts is held until the
// shim has exec'd CMD, so that CMD gets it: the shim, holdfast's own
// runtime, would ignore USR1 and USR2 and answer QUIT with a goroutine dump
// and exit 2 (recheck33: 21 of 30 runs lost USR1 sent as the shim
// appeared). The shim pauses 300 ms before its exec (shimPause); the
// signal comes 100 ms after the start.
func TestSignalBeforeExec(t *testing.T) {
	e := etcdtest.Etcd(t)
	ctx := context.Background()
	s, err := hfetcd.NewSession(ctx, e.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := hfetcd.NewMutex(s, "shim/sig")
	if err != nil {
		t.Fatal(err)
	}
	for i, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGQUIT, syscall.SIGUSR2} {
		g, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sigs := make(chan os.Signal, 1)
		time.AfterFunc(100*time.Millisecond, func() { sigs <- sig }) // the shim's runtime is up, its exec 200 ms away
		var stderr syncBuffer
		cmd := exec.Command("sleep", "5")
		cmd.Env = append(os.Environ(), "HOLDFAST_TEST_SHIM_PAUSE=300ms")
		werr, lost, err := runUnder(ctx, g, cmd, policing{name: "shim/sig", what: "the lock", grace: time.Second, ttl: s.TTL(), stderr: &stderr, sigs: sigs})
		if err != nil || lost != nil {
			t.Fatalf("run %d: runUnder: %v, lost %v", i, err, lost)
		}
		var ee *exec.ExitError
		if !errors.As(werr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != sig {
			t.Errorf("run %d: CMD (sleep 5) ended with %v, want killed by %v passed on", i, werr, sig)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
