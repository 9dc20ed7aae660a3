package main

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// TestStopWhileWaitingLong: a waiter typed at a shell, stopped by Ctrl-Z
// for longer than its store's request timeout (5 s), then resumed by fg,
// waits again as the help says ("fg waits again, behind whoever came
// meanwhile") and runs CMD to its end once the holder is done. Found by
// trying it (breaker): after SIGTSTP holdfast sent itself SIGSTOP and went
// straight on to open the next session; the kill returns before the stop
// has taken every thread, so the next session's timeouts (etcd's dial and
// lease grant, Consul's session create) started before the stop, which
// then ran them down: on fg, exit 125 with "context deadline exceeded" (or,
// after a shorter stop, a grant with seconds left and CMD killed by the
// guard, exit 122). Now holdfast waits for the SIGCONT before it opens
// anything (stopUntilContinued). Three stops of 7 s on each store.
func TestStopWhileWaitingLong(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"etcd", "consul"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			var flags []string
			// The waiter is in the queue: -v said so once more.
			waiting := func(sh *shell, round int) bool { return strings.Count(sh.out.String(), "waiting behind") >= round }
			switch store {
			case "etcd":
				e := etcdtest.Etcd(t)
				c := e.Client(t)
				flags = []string{"--endpoints", e.Endpoints()[0], "--ttl", "5s"}
				waiting = func(*shell, int) bool { return len(keysUnder(t, c, "tstp-long/")) == 2 }
			case "consul":
				a := embedtest.Consul(t)
				flags = []string{"--backend", "consul", "--addr", a.HTTPAddr, "--ttl", "10s", "--lock-delay", "0"}
			}
			stopWhileWaitingLong(t, flags, waiting)
		})
	}
}

// stopWhileWaitingLong runs TestStopWhileWaitingLong with the store flags
// flags; waiting reports whether the shell's waiter is in the queue (for
// the round-th time).
func stopWhileWaitingLong(t *testing.T, flags []string, waiting func(sh *shell, round int) bool) {
	holder := start(t, append(append([]string{"lock", "-v"}, flags...), "tstp-long", "--", "sleep", "120")...)
	eventually(t, 30*time.Second, "the holder did not get the lock", func() bool { return strings.Contains(holder.stderr.String(), "acquired") })
	sh := startShell(t)
	sh.typ(t, fmt.Sprintf("holdfast lock -v %s tstp-long -- sleep 3\n", strings.Join(flags, " ")))
	for round := 1; round <= 3; round++ {
		eventually(t, 10*time.Second, fmt.Sprintf("round %d: the waiter does not wait", round), func() bool { return waiting(sh, round) })
		sh.typ(t, "\x1a")
		sh.expect(t, "Stopped", round)
		time.Sleep(7 * time.Second) // past the store's request timeout (5 s)
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
	sh.typ(t, `echo "rc=$?"`+"\n") // typed ahead, while CMD runs: the terminal echoes it at once
	status := regexp.MustCompile(`rc=[0-9]`)
	eventually(t, 15*time.Second, "the shell did not print the waiter's exit status", func() bool { return status.MatchString(sh.out.String()) })
	if !strings.Contains(sh.out.String(), "rc=0") {
		t.Errorf("the resumed waiter did not run CMD to its end; the terminal shows:\n%s", sh.out.String())
	}
}
