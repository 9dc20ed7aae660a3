package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/holdfast/holdfast/internal/mutant"
)

// CMD must not outlive holdfast's grant, even when holdfast cannot act:
// killed (kill -9, the OOM killer) or merely stopped (SIGSTOP, Ctrl-Z, a
// debugger), when it renews nothing and the store expires the grant while
// CMD runs on. Two mechanisms, both set up by startGuarded:
//
//  1. On Linux the kernel sends CMD itself SIGKILL when holdfast dies
//     (SysProcAttr.Pdeathsig, see guard_linux.go).
//  2. On every Unix, a guard process (this binary run again, in its own
//     session, ignoring the signals a terminal or holdfast's group gets)
//     holds the read end of a pipe whose write end only holdfast has.
//     Holdfast feeds it, every feedEvery, the grant's safe deadline (see
//     holdfast.Grant.Deadline) on the system's monotonic clock
//     (CLOCK_MONOTONIC, the same in both processes: the deadline is the
//     one the grant's context ends at, computed from when the last
//     acknowledged renewal was sent). The guard acts when the feed stops,
//     that is when holdfast cannot run: from kill-grace before the
//     deadline (or as soon as the feed is found stopped, if later) it
//     sends CMD's process group SIGTERM (and SIGCONT, for a stopped CMD
//     to handle it), and SIGKILL just before the deadline. When holdfast
//     dies the kernel closes the write end; the guard reads EOF and sends
//     SIGKILL at once. When CMD has exited, holdfast sends a stand-down
//     message and the guard exits without killing.
//
// While the feed flows, holdfast is alive and handles a loss itself; the
// guard does nothing. When holdfast stops itself with CMD (job control,
// Ctrl-Z) it says so first: CMD does not run until both are resumed, so
// the guard only sends SIGKILL just before the deadline, and an "fg"
// before it resumes both.

// guardEnv names the environment variable that makes this binary a guard:
// its value is "PGID,GRACE": the process group to stop and --kill-grace in
// nanoseconds.
const guardEnv = "HOLDFAST_INTERNAL_GUARD_PGID"

const (
	// feedEvery is how often holdfast feeds the guard the grant's deadline.
	feedEvery = 100 * time.Millisecond
	// killAhead is how long before the deadline the guard sends SIGKILL.
	killAhead = 20 * time.Millisecond
	// A feed older than staleAfter(deadline-lastFeed) means holdfast
	// cannot run: half the time that was left (the other half is CMD's
	// grace at least), between minStale and maxStale.
	minStale, maxStale = 150 * time.Millisecond, time.Second
)

// The guard's messages: one byte, then a big-endian int64.
const (
	msgDeadline  = 'D' // the grant's safe deadline, CLOCK_MONOTONIC ns
	msgStandDown = 'S' // CMD exited: exit without killing
	msgJobStop   = 'Z' // holdfast stops with CMD (job control) until the next deadline
)

func init() {
	if v, ok := os.LookupEnv(guardEnv); ok {
		os.Exit(guardMain(v))
	}
}

// monoNow is CLOCK_MONOTONIC in nanoseconds: the clock Go's monotonic time
// reads on Linux, shared by every process of the machine.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // cannot happen: CLOCK_MONOTONIC is always there
	}
	return ts.Nano()
}

func staleAfter(left time.Duration) time.Duration {
	return min(max(left/2, minStale), maxStale)
}

// guardMain is the guard process: it reads holdfast's feed on fd 3 and
// stops the process group pgid when the feed stops before the deadline it
// last gave, or when the pipe ends without a stand-down.
func guardMain(arg string) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU)
	var id int
	var grace time.Duration
	if _, err := fmt.Sscanf(arg, "%d,%d", &id, &grace); err != nil || id <= 1 || grace < 0 {
		return 2
	}
	msgs := make(chan [9]byte)
	go func() {
		defer close(msgs)
		f := os.NewFile(3, "holdfast-guard")
		for {
			var m [9]byte
			if _, err := io.ReadFull(f, m[:]); err != nil {
				return
			}
			msgs <- m
		}
	}()
	say := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "holdfast: guard: "+format+"\n", args...)
	}
	var deadline, fed int64 // CLOCK_MONOTONIC ns; deadline 0: none yet
	// termed: SIGTERM was sent. jobStopped: holdfast stopped itself and
	// CMD (Ctrl-Z): CMD does not run until "fg", so it is killed only at
	// the deadline (a stopped command could not use a grace), and "fg"
	// before it resumes both.
	termed, jobStopped := false, false
	for {
		// The next moment to look again: when the feed would be stale, or
		// when the deadline asks for SIGTERM or SIGKILL.
		wake := time.Duration(1<<62 - 1)
		if deadline != 0 && !mutant.On("cmd/guard-deadline") {
			now := monoNow()
			left := time.Duration(deadline - now)
			stale := jobStopped || time.Duration(now-fed) >= staleAfter(time.Duration(deadline-fed))
			switch {
			case stale && left <= killAhead:
				say("holdfast has not run for %v, the grant's deadline is here: SIGKILL to the command's process group", time.Duration(now-fed).Round(time.Millisecond))
				_ = syscall.Kill(-id, syscall.SIGKILL)
				return 0
			case stale && !termed && !jobStopped && left <= grace+killAhead:
				say("holdfast has not run for %v, the grant's deadline is %v away: SIGTERM to the command's process group (SIGKILL before the deadline)", time.Duration(now-fed).Round(time.Millisecond), left.Round(time.Millisecond))
				termed = true
				_ = syscall.Kill(-id, syscall.SIGTERM)
				_ = syscall.Kill(-id, syscall.SIGCONT) // a stopped command gets its grace too
			}
			switch {
			case !stale: // look again when it would be
				wake = time.Duration(fed-now) + staleAfter(time.Duration(deadline-fed))
			case termed, jobStopped:
				wake = left - killAhead
			default:
				wake = left - killAhead - grace
			}
			wake = max(wake, time.Millisecond)
		}
		t := time.NewTimer(wake)
		select {
		case m, ok := <-msgs:
			t.Stop()
			if !ok { // holdfast died: nobody renews, nobody escalates
				_ = syscall.Kill(-id, syscall.SIGKILL)
				return 0
			}
			switch m[0] {
			case msgStandDown:
				return 0
			case msgDeadline:
				deadline, fed, jobStopped = int64(binary.BigEndian.Uint64(m[1:])), monoNow(), false
			case msgJobStop:
				jobStopped = true
			}
		case <-t.C:
		}
	}
}

// guard is a running guard process, fed with feed and stood down with
// standDown.
type guard struct {
	proc      *exec.Cmd
	mu        sync.Mutex
	w         *os.File // nil once stood down
	suspended bool     // between jobStop and jobResume: no feed
}

// startGuarded starts cmd in its own process group, stopped by the kernel
// (Linux) should holdfast die, and by a guard process should holdfast die
// or stop feeding it deadlines (see guard.feed) for grace before the last
// one. If the guard cannot be started, CMD still runs; the returned
// warning says what is missing.
func startGuarded(cmd *exec.Cmd, grace time.Duration) (g *guard, warning error, err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	setParentDeathSignal(cmd.SysProcAttr)
	onStarterThread(func() { err = cmd.Start() })
	if err != nil {
		return nil, nil, err
	}
	g, warning = newGuard(cmd.Process.Pid, grace)
	return g, warning, nil
}

func newGuard(pgid int, grace time.Duration) (*guard, error) {
	if mutant.On("cmd/kill-guard") {
		return nil, nil
	}
	exe, err := selfExecutable()
	if err != nil {
		return nil, fmt.Errorf("no guard for the command (it may outlive a killed or stopped holdfast): %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("no guard for the command (it may outlive a killed or stopped holdfast): %w", err)
	}
	defer r.Close()
	p := exec.Command(exe)
	p.Env = []string{guardEnv + "=" + strconv.Itoa(pgid) + "," + strconv.FormatInt(int64(grace), 10)}
	if m, ok := os.LookupEnv("HOLDFAST_MUTANT"); ok { // a mutant build's guard removes the same guard
		p.Env = append(p.Env, "HOLDFAST_MUTANT="+m)
	}
	p.ExtraFiles = []*os.File{r}
	p.Stderr = os.Stderr
	p.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := p.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("no guard for the command (it may outlive a killed or stopped holdfast): %w", err)
	}
	return &guard{proc: p, w: w}, nil
}

func (g *guard) send(op byte, v int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch op {
	case msgJobStop:
		g.suspended = true
	case msgDeadline:
		if g.suspended {
			return
		}
	}
	if g.w == nil {
		return
	}
	var m [9]byte
	m[0] = op
	binary.BigEndian.PutUint64(m[1:], uint64(v))
	_, _ = g.w.Write(m[:])
}

// feed tells the guard the grant's safe deadline, a time on this process's
// monotonic clock.
func (g *guard) feed(deadline time.Time) {
	if g == nil {
		return
	}
	now := monoNow() // read first: a pause before the next line makes the deadline sent earlier, never later
	g.send(msgDeadline, now+int64(time.Until(deadline)))
}

// jobStop tells the guard that holdfast stops itself with CMD (job
// control): no feed until jobResume.
func (g *guard) jobStop() {
	if g != nil {
		g.send(msgJobStop, 0)
	}
}

// jobResume lets feed feed again.
func (g *guard) jobResume() {
	if g != nil {
		g.mu.Lock()
		g.suspended = false
		g.mu.Unlock()
	}
}

// standDown tells the guard that CMD has exited and waits for it to go.
func (g *guard) standDown() {
	if g == nil {
		return
	}
	g.send(msgStandDown, 0)
	g.mu.Lock()
	if g.w != nil {
		g.w.Close()
		g.w = nil
	}
	g.mu.Unlock()
	_ = g.proc.Wait()
}

// The parent-death signal is sent when the thread that started the child
// exits, not the process (golang/go#27505), and the Go runtime may end a
// thread. Children are therefore started from one goroutine locked to its
// thread for the life of the process: that thread exits only with it.
var (
	starterOnce sync.Once
	starter     = make(chan func())
)

func onStarterThread(fn func()) {
	starterOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for f := range starter {
				f()
			}
		}()
	})
	done := make(chan struct{})
	starter <- func() { defer close(done); fn() }
	<-done
}
