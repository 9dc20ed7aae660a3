package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// TestStopWhileWaitingLong: a waiter typed at a shell, stopped by Ctrl-Z
// for longer than its TTL, then resumed by fg, waits again as the help
// says ("fg waits again, behind whoever came meanwhile") and runs CMD to
// its end once the holder is done. Found by trying it (breaker): after
// SIGTSTP holdfast sends itself SIGSTOP and goes straight on to open the
// next session, whose request (its send time, its timeout) can start
// before the stop takes effect; on fg it is past its deadline (etcd "grant
// lease: context deadline exceeded" or "dial: ...", Consul "create session:
// ... context deadline exceeded" or "stopped waiting: ... expired before it
// was granted", exit 125) or, after a shorter stop, granted with a few
// seconds left and CMD killed by the guard 0.3 s after it started (exit
// 122). Three stops of 7 s at TTL 5 s.
func TestStopWhileWaitingLong(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	c := e.Client(t)
	flags := []string{"--endpoints", e.Endpoints()[0], "--ttl", "5s"}
	holder := start(t, append(append([]string{"lock", "-v"}, flags...), "tstp-long", "--", "sleep", "120")...)
	eventually(t, 30*time.Second, "the holder did not get the lock", func() bool { return strings.Contains(holder.stderr.String(), "acquired") })
	sh := startShell(t)
	sh.typ(t, fmt.Sprintf("holdfast lock -v %s tstp-long -- sleep 3\n", strings.Join(flags, " ")))
	for round := 1; round <= 3; round++ {
		eventually(t, 10*time.Second, fmt.Sprintf("round %d: the waiter does not wait", round), func() bool { return len(keysUnder(t, c, "tstp-long/")) == 2 })
		sh.typ(t, "\x1a")
		sh.expect(t, "Stopped", round)
		time.Sleep(7 * time.Second) // past the TTL
		sh.typ(t, "fg\n")
		time.Sleep(2 * time.Second)
		if strings.Contains(sh.out.String(), "no such job") || strings.Count(sh.out.String(), "stopped waiting") > 0 || strings.Contains(sh.out.String(), "deadline exceeded") {
			t.Fatalf("round %d: the resumed waiter did not wait again; the terminal shows:\n%s", round, sh.out.String())
		}
	}
	if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	holder.wait(t, 10*time.Second)
	sh.expect(t, "acquired", 1)
	sh.typ(t, `echo "rc=$?"`+"\n")
	sh.expect(t, "rc=", 1)
	if !strings.Contains(sh.out.String(), "rc=0") {
		t.Errorf("the resumed waiter did not run CMD to its end; the terminal shows:\n%s", sh.out.String())
	}
}
