package core

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/holdfast/holdfast"
)

// Most Keeper tests run in a synctest bubble: time is virtual, so deadlines
// are checked to the nanosecond and the tests take no real time. One test
// (TestKeeperRealClock) checks the same thing on the real clock.

// alive reports whether k has not ended, after letting every goroutine of
// the bubble (a firing timer) run.
func alive(k *Keeper) bool {
	synctest.Wait()
	return k.Context().Err() == nil && k.Err() == nil
}

func TestKeeperExpiresAtSentPlusTTLMinusMargin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sent := time.Now()
		k := NewKeeper(sent, 200*time.Millisecond, 50*time.Millisecond)
		if got, want := k.Deadline(), sent.Add(150*time.Millisecond); !got.Equal(want) {
			t.Fatalf("Deadline() = sent+%v, want sent+150ms", got.Sub(sent))
		}
		if !alive(k) {
			t.Fatalf("ended at once: %v", k.Err())
		}
		time.Sleep(150*time.Millisecond - time.Nanosecond)
		if !alive(k) {
			t.Fatalf("ended 1ns before the deadline (sent+ttl-margin): %v", k.Err())
		}
		time.Sleep(time.Nanosecond)
		if alive(k) {
			t.Fatal("still alive at the deadline (sent+ttl-margin)")
		}
		if k.Context().Err() != context.Canceled {
			t.Errorf("Context().Err() = %v, want context.Canceled", k.Context().Err())
		}
	})
}

// The deadline counts from when the request was sent, not from when the
// Keeper was created (when the answer arrived).
func TestKeeperDeadlineCountsFromSendTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sent := time.Now()
		time.Sleep(100 * time.Millisecond) // the request took 100ms
		k := NewKeeper(sent, 200*time.Millisecond, 50*time.Millisecond)
		if got := k.Deadline().Sub(sent); got != 150*time.Millisecond {
			t.Fatalf("Deadline() = sent+%v, want sent+150ms", got)
		}
		time.Sleep(50*time.Millisecond - time.Nanosecond)
		if !alive(k) {
			t.Fatalf("ended before sent+ttl-margin: %v", k.Err())
		}
		time.Sleep(time.Nanosecond)
		if alive(k) {
			t.Fatal("alive after sent+ttl-margin: the deadline was counted from creation, not from the send time")
		}
	})
}

func TestKeeperDeadlineAlreadyPassed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sent := time.Now()
		time.Sleep(time.Second) // the answer came later than ttl-margin
		k := NewKeeper(sent, 200*time.Millisecond, 50*time.Millisecond)
		_ = k.Deadline()
		if alive(k) {
			t.Fatal("alive although sent+ttl-margin had already passed when the Keeper was created")
		}
		if !errors.Is(k.Err(), holdfast.ErrSessionLost) {
			t.Errorf("Err() = %v, want ErrSessionLost", k.Err())
		}
		if k.Renewed(time.Now(), time.Minute, time.Second) {
			t.Error("Renewed revived a Keeper that had ended")
		}
	})
}

func TestKeeperExpiryCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := NewKeeper(time.Now(), 200*time.Millisecond, 50*time.Millisecond)
		_ = k.Deadline()
		if err := k.Err(); err != nil {
			t.Fatalf("Err() of a live Keeper = %v, want nil", err)
		}
		<-k.Context().Done()
		cause := context.Cause(k.Context())
		for _, target := range []error{holdfast.ErrSessionLost, holdfast.ErrLost} {
			if !errors.Is(cause, target) {
				t.Errorf("cause %v does not wrap %v", cause, target)
			}
		}
		for _, other := range []error{holdfast.ErrSessionClosed, holdfast.ErrReleased, context.DeadlineExceeded} {
			if errors.Is(cause, other) {
				t.Errorf("cause %v wraps %v", cause, other)
			}
		}
		if k.Err() != cause {
			t.Errorf("Err() = %v, want the context's cause %v", k.Err(), cause)
		}
	})
}

func TestKeeperRenewedMovesDeadlineForwardOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl, margin = 200 * time.Millisecond, 50 * time.Millisecond
		t0 := time.Now()
		k := NewKeeper(t0, ttl, margin)
		at := func(d time.Duration) time.Time { return t0.Add(d) }
		check := func(what string, want time.Duration) {
			t.Helper()
			if got := k.Deadline().Sub(t0); got != want {
				t.Fatalf("%s: Deadline() = t0+%v, want t0+%v", what, got, want)
			}
		}

		time.Sleep(100 * time.Millisecond)
		if !k.Renewed(at(100*time.Millisecond), ttl, margin) {
			t.Fatal("Renewed on a live Keeper returned false")
		}
		check("renewal sent at t0+100ms", 250*time.Millisecond)

		// A late acknowledgement of an older renewal must not move it back,
		// nor must a renewal granting a shorter TTL.
		if !k.Renewed(at(50*time.Millisecond), ttl, margin) {
			t.Fatal("Renewed (older send time) on a live Keeper returned false")
		}
		check("older renewal acknowledged late", 250*time.Millisecond)
		if !k.Renewed(at(100*time.Millisecond), 100*time.Millisecond, margin) {
			t.Fatal("Renewed (shorter TTL) on a live Keeper returned false")
		}
		check("renewal with a shorter TTL", 250*time.Millisecond)

		// An older send time with a longer TTL still gives a later deadline.
		if !k.Renewed(at(60*time.Millisecond), 300*time.Millisecond, margin) {
			t.Fatal("Renewed returned false")
		}
		check("older send time, longer TTL", 310*time.Millisecond)

		// The first timer (t0+150ms) must not end it, nor the second
		// (t0+250ms); the deadline in force (t0+310ms) must.
		time.Sleep(210*time.Millisecond - time.Nanosecond) // t0+310ms-1ns
		if !alive(k) {
			t.Fatalf("ended before the renewed deadline: %v", k.Err())
		}
		time.Sleep(time.Nanosecond)
		if alive(k) {
			t.Fatal("alive after the renewed deadline: the timer was not moved with the deadline")
		}
		if !errors.Is(k.Err(), holdfast.ErrSessionLost) {
			t.Errorf("Err() = %v, want ErrSessionLost", k.Err())
		}
	})
}

// Renewing many times keeps the session alive well past the first deadline.
func TestKeeperRenewalsKeepItAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl, margin = 300 * time.Millisecond, 100 * time.Millisecond
		k := NewKeeper(time.Now(), ttl, margin)
		for range 30 { // renew every TTL/3 for 3s
			time.Sleep(ttl / 3)
			sent := time.Now()
			if !alive(k) {
				t.Fatalf("ended although renewed every TTL/3: %v", k.Err())
			}
			if !k.Renewed(sent, ttl, margin) {
				t.Fatal("Renewed returned false on a live Keeper")
			}
			if got := k.Deadline(); !got.Equal(sent.Add(ttl - margin)) {
				t.Fatalf("Deadline() = %v after a renewal sent at %v, want %v", got, sent, sent.Add(ttl-margin))
			}
		}
		start := time.Now()
		<-k.Context().Done()
		if got := time.Since(start); got != ttl-margin {
			t.Errorf("ended %v after the last renewal, want %v", got, ttl-margin)
		}
	})
}

func TestKeeperRenewedAfterEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := NewKeeper(time.Now(), 200*time.Millisecond, 50*time.Millisecond)
		before := k.Deadline()
		k.End(holdfast.ErrSessionClosed)
		if k.Renewed(time.Now(), time.Hour, 0) {
			t.Error("Renewed after End returned true")
		}
		if got := k.Deadline(); !got.Equal(before) {
			t.Errorf("a refused renewal moved the deadline from %v to %v", before, got)
		}
		if !errors.Is(k.Err(), holdfast.ErrSessionClosed) {
			t.Errorf("Err() = %v, want ErrSessionClosed", k.Err())
		}
	})
}

func TestKeeperRenewedAfterExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := NewKeeper(time.Now(), 200*time.Millisecond, 50*time.Millisecond)
		sent := time.Now()
		before := k.Deadline()
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		// The acknowledgement of a renewal sent in time arrives after the
		// deadline: holders have already been told the session is lost.
		if k.Renewed(sent, 200*time.Millisecond, 50*time.Millisecond) {
			t.Error("Renewed after the deadline had ended the Keeper returned true")
		}
		if got := k.Deadline(); !got.Equal(before) {
			t.Errorf("a refused renewal moved the deadline from %v to %v", before, got)
		}
		if !errors.Is(k.Err(), holdfast.ErrSessionLost) {
			t.Errorf("Err() = %v, want ErrSessionLost", k.Err())
		}
	})
}

func TestKeeperEndFirstCauseWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first := errors.New("first")
		second := errors.New("second")
		k := NewKeeper(time.Now(), 200*time.Millisecond, 50*time.Millisecond)
		_ = k.Deadline()
		k.End(first)
		if alive(k) {
			t.Fatal("alive after End")
		}
		k.End(second)
		if got := context.Cause(k.Context()); got != first {
			t.Errorf("cause after End(first), End(second) = %v, want first", got)
		}
		// The deadline passing later must not replace the cause either.
		time.Sleep(time.Second)
		synctest.Wait()
		if got := k.Err(); got != first {
			t.Errorf("Err() after End(first) and the deadline = %v, want first", got)
		}
	})
}

func TestKeeperEndAfterExpiryKeepsExpiryCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := NewKeeper(time.Now(), 200*time.Millisecond, 50*time.Millisecond)
		_ = k.Deadline()
		<-k.Context().Done()
		k.End(holdfast.ErrSessionClosed)
		if err := k.Err(); !errors.Is(err, holdfast.ErrSessionLost) || errors.Is(err, holdfast.ErrSessionClosed) {
			t.Errorf("Err() after expiry then End(ErrSessionClosed) = %v, want the expiry's ErrSessionLost", err)
		}
	})
}

func TestKeeperEndNilCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := NewKeeper(time.Now(), time.Second, 0)
		_ = k.Deadline()
		k.End(nil)
		if k.Err() == nil {
			t.Error("Err() = nil after End(nil)")
		}
	})
}

// The bubble fails the test if a goroutine is left blocked when it returns;
// this also counts goroutines on the real clock.
func TestKeeperNoGoroutineLeak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for i := range 100 {
			k := NewKeeper(time.Now(), time.Duration(i+1)*time.Millisecond, 0)
			_ = k.Deadline()
			if i%2 == 0 {
				k.End(holdfast.ErrSessionClosed)
			} else {
				<-k.Context().Done()
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
	})

	before := runtime.NumGoroutine()
	ks := make([]*Keeper, 1000)
	for i := range ks {
		ks[i] = NewKeeper(time.Now(), time.Minute, time.Second)
		_ = ks[i].Deadline()
	}
	for _, k := range ks {
		k.Renewed(time.Now(), time.Minute, time.Second)
		k.End(holdfast.ErrSessionClosed)
	}
	deadline := time.Now().Add(time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after 1000 Keepers ended, %d before", n, before)
	}
}

// The same deadline on the real (monotonic) clock, with slack for a loaded
// machine: never ended before sent+ttl-margin, ended soon after, and a
// renewal moves the real timer.
func TestKeeperRealClock(t *testing.T) {
	t.Parallel()
	const ttl, margin = 2 * time.Second, 500 * time.Millisecond
	const slack = 2 * time.Second
	sent := time.Now()
	k := NewKeeper(sent, ttl, margin)
	if got := k.Deadline(); !got.Equal(sent.Add(ttl - margin)) {
		t.Fatalf("Deadline() = sent+%v, want sent+%v", got.Sub(sent), ttl-margin)
	}

	time.Sleep(100 * time.Millisecond)
	sent2 := time.Now()
	if !k.Renewed(sent2, ttl, margin) {
		t.Fatalf("Renewed returned false %v after sent, %v before the deadline", time.Since(sent), ttl-margin-time.Since(sent))
	}
	select {
	case <-k.Context().Done():
		if e := time.Since(sent2); e < ttl-margin {
			t.Fatalf("ended %v after the renewal was sent, before its deadline (%v)", e, ttl-margin)
		}
	case <-time.After(ttl - margin + slack):
		t.Fatalf("still alive %v after the renewed deadline", slack)
	}
	if !errors.Is(k.Err(), holdfast.ErrSessionLost) {
		t.Errorf("Err() = %v, want ErrSessionLost", k.Err())
	}
}

// Check ends the session as soon as the deadline has passed on the monotonic
// clock, without waiting for the timer: a process resumed after a pause sees
// the session as lost at its first look. The timer cannot fire in between:
// the loop below never blocks, and with one P the timer only runs when the
// loop is preempted (every 10 ms at most); trials where that happened within
// the few microseconds between the deadline and the check are ignored.
func TestKeeperCheckIsSynchronous(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	checked := 0
	for range 20 {
		k := NewKeeper(time.Now(), 5*time.Millisecond, 0)
		deadline := k.Deadline()
		for time.Now().Before(deadline) { // spin, never block
		}
		if k.Context().Err() != nil {
			continue // the timer won the race: not a check of Check
		}
		checked++
		if err := k.Check(); !errors.Is(err, holdfast.ErrSessionLost) {
			t.Fatalf("Check() right after the deadline = %v, want ErrSessionLost", err)
		}
		if k.Context().Err() == nil {
			t.Fatal("Check() returned the loss but the context is still live")
		}
	}
	if checked < 10 {
		t.Fatalf("only %d of 20 trials reached Check before the timer fired", checked)
	}
}

// A Keeper created after its deadline (the session request took longer than
// TTL minus margin) ends at once and never touches a timer it has not armed.
func TestKeeperExpiresWithoutOtherCalls(t *testing.T) {
	k := NewKeeper(time.Now(), 20*time.Millisecond, 0)
	select {
	case <-k.Context().Done():
	case <-time.After(time.Second):
		t.Fatal("still alive 1s after a 20ms deadline")
	}
}

const keeperChildEnv = "HOLDFAST_CORE_TEST_KEEPER_CHILD"

// Keepers whose deadline has already passed, created in a loop: the timer
// fires at once, possibly before NewKeeper returns. The loop runs in a child
// process so that a crash on the timer's goroutine fails this test rather
// than the whole test binary.
func TestKeeperPastDeadlineDoesNotCrash(t *testing.T) {
	if os.Getenv(keeperChildEnv) == "1" {
		for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
			k := NewKeeper(time.Now().Add(-time.Second), 10*time.Millisecond, 0)
			<-k.Context().Done()
		}
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKeeperPastDeadlineDoesNotCrash$", "-test.count=1")
	cmd.Env = append(os.Environ(), keeperChildEnv+"=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("creating Keepers whose deadline has already passed: %v\n%s", err, out)
	}
}
