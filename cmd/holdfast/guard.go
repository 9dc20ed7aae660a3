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

// CMD must not outlive holdfast's grant: it is dead (SIGKILL delivered to
// its process group) by the grant's safe deadline (holdfast.Grant.Deadline),
// whatever happens to holdfast: killed (kill -9, the OOM killer), stopped
// (SIGSTOP, Ctrl-Z, a debugger), or alive but cut off from a store that no
// longer confirms its renewals. Two mechanisms, both set up by
// startGuarded:
//
//  1. On Linux the kernel sends CMD itself SIGKILL when holdfast dies
//     (SysProcAttr.Pdeathsig, see guard_linux.go).
//  2. On every Unix, a guard process (this binary run again, in its own
//     session, ignoring the signals a terminal or holdfast's group gets)
//     holds the read end of a pipe whose write end only holdfast has.
//     Holdfast feeds it, every feedEvery, the grant's deadline on the
//     system's monotonic clock (CLOCK_MONOTONIC, the same in both
//     processes: the deadline the grant's context ends at, computed from
//     when the last acknowledged renewal was sent); it is started before
//     CMD with the deadline of that moment, so it has one whatever
//     happens to holdfast next, and CMD runs only once the guard knows
//     its process group (shim.go). The guard acts on the
//     deadline alone, so the same rule holds whether holdfast is alive
//     with the store silent (the deadline it feeds stops moving) or
//     cannot run (the feed stops): it sends CMD's process group SIGTERM
//     (and SIGCONT, for a stopped CMD to handle it) termGrace before the
//     deadline, and SIGKILL killAhead before it. While renewals are
//     confirmed the deadline keeps ahead of both: a renewal is sent every
//     TTL/3 and moves the deadline to TTL - TTL/5 after it was sent, so
//     the SIGTERM comes only once no renewal was confirmed for 3/5 of the
//     TTL (a renewal late by 4/15 of the TTL, 4 s at the default 15 s, and
//     by 1 s at any TTL, stops nothing). When holdfast dies the kernel closes the write end;
//     the guard reads EOF and sends SIGKILL at once. When CMD has exited,
//     holdfast sends a stand-down message and the guard exits without
//     killing. The guard tells holdfast what it did on a second pipe, so
//     that holdfast reports the stop as a loss (exit 122).
//
// When holdfast stops itself with CMD (job control, Ctrl-Z) it says so
// first: CMD does not run until both are resumed, so the guard sends no
// SIGTERM (it would resume a stopped CMD), only SIGKILL at the deadline,
// and an "fg" before it resumes both.

// guardEnv names the environment variable that makes this binary a guard:
// its value is "GRACE,DEADLINE": --kill-grace in nanoseconds and the
// grant's deadline as CMD starts (CLOCK_MONOTONIC ns, as msgDeadline). The
// guard is started before CMD, so that it knows a deadline before CMD
// runs, whatever happens to holdfast; holdfast tells it CMD's process
// group (msgGroup) as soon as CMD has started.
const guardEnv = "HOLDFAST_INTERNAL_GUARD_PGID"

const (
	// feedEvery is how often holdfast feeds the guard the grant's deadline.
	feedEvery = 100 * time.Millisecond
	// killAhead is how long before the deadline the guard sends SIGKILL.
	killAhead = 20 * time.Millisecond
)

// termGrace is how long before the grant's deadline the guard sends
// SIGTERM: --kill-grace, but at most TTL/5, and at most 7/15 TTL -
// lateTolerance. The deadline is TTL - TTL/5 after the last confirmed
// renewal was sent and renewals go every TTL/3, so while they are
// confirmed the deadline stays at least 7/15 of the TTL ahead: a renewal
// late by up to 4/15 TTL, and by at least lateTolerance (a loaded machine,
// a slow store), stops nothing. Below a TTL of about 2.1 s there is no
// room for a grace: SIGTERM comes with the SIGKILL.
func termGrace(grace, ttl time.Duration) time.Duration {
	if mutant.On("cmd/term-grace") {
		return grace
	}
	return min(grace, ttl/5, max(0, ttl*7/15-lateTolerance))
}

// lateTolerance is how late a renewal may be confirmed without the guard
// stopping CMD, at the least.
const lateTolerance = time.Second

// The guard's messages: one byte, then a big-endian int64.
const (
	msgDeadline  = 'D' // the grant's safe deadline, CLOCK_MONOTONIC ns
	msgStandDown = 'S' // CMD exited: exit without killing
	msgJobStop   = 'Z' // holdfast stops with CMD (job control) until the next deadline
	msgGroup     = 'P' // CMD's process group
)

// What the guard did, one byte each on its second pipe to holdfast.
const (
	actTerm = 'T' // SIGTERM: the deadline is termGrace away
	actKill = 'K' // SIGKILL: the deadline is here, or holdfast died
)

// guardArg0 is the guard's argv[0], which it must have too (a user's
// environment with guardEnv alone does not make holdfast a guard).
const guardArg0 = "holdfast-guard"

func init() {
	if v, ok := os.LookupEnv(guardEnv); ok && os.Args[0] == guardArg0 {
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

// guardMain is the guard process: it reads holdfast's feed on fd 3,
// reports what it does on fd 4, and stops the process group pgid by the
// deadline it was last fed (SIGTERM grace before it, SIGKILL just
// before), or at once when the pipe ends without a stand-down.
func guardMain(arg string) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU)
	var grace time.Duration
	var deadline int64 // CLOCK_MONOTONIC ns
	if _, err := fmt.Sscanf(arg, "%d,%d", &grace, &deadline); err != nil || grace < 0 || deadline <= 0 {
		return 2
	}
	// id is CMD's process group once holdfast has said it (msgGroup); until
	// then (holdfast stopped as CMD started), the guard stops the process
	// groups led by holdfast's children in its session: CMDs, not guards.
	id, parent := 0, os.Getppid()
	if mutant.On("cmd/guard-first-deadline") {
		deadline = 0
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
	report := os.NewFile(4, "holdfast-guard-report")
	signalCmd := func(sig syscall.Signal) {
		if id != 0 {
			_ = syscall.Kill(-id, sig)
			return
		}
		for _, pg := range childGroups(parent) {
			_ = syscall.Kill(-pg, sig)
		}
	}
	act := func(a byte, sig syscall.Signal) {
		_, _ = report.Write([]byte{a}) // first: holdfast must know the stop is ours before it sees CMD's end
		signalCmd(sig)
	}
	say := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "holdfast: guard: "+format+"\n", args...)
	}
	fed := monoNow() // CLOCK_MONOTONIC ns, when holdfast last fed a deadline
	// termed: SIGTERM was sent; the deadline no longer moves (CMD's grace
	// ends where it was). jobStopped: holdfast stopped itself and CMD
	// (Ctrl-Z): CMD does not run until "fg", so it is killed only at the
	// deadline (a stopped command could not use a grace), and "fg" before
	// it resumes both.
	termed, jobStopped := false, false
	for {
		// The next moment to look again: when the deadline asks for
		// SIGTERM or SIGKILL.
		wake := time.Duration(1<<62 - 1)
		if deadline != 0 && !mutant.On("cmd/guard-deadline") {
			now := monoNow()
			left := time.Duration(deadline - now)
			switch {
			case left <= killAhead:
				say("the grant's deadline is here and no renewal moved it (holdfast last ran %v ago): SIGKILL to the command's process group", time.Duration(now-fed).Round(time.Millisecond))
				act(actKill, syscall.SIGKILL)
				return 0
			case !termed && !jobStopped && left <= grace+killAhead:
				say("the grant's deadline is %v away and no renewal moved it (holdfast last ran %v ago): SIGTERM to the command's process group (SIGKILL before the deadline)", left.Round(time.Millisecond), time.Duration(now-fed).Round(time.Millisecond))
				termed = true
				act(actTerm, syscall.SIGTERM)
				signalCmd(syscall.SIGCONT) // a stopped command gets its grace too
			}
			if termed || jobStopped {
				wake = left - killAhead
			} else {
				wake = left - killAhead - grace
			}
			wake = max(wake, time.Millisecond)
		}
		t := time.NewTimer(wake)
		select {
		case m, ok := <-msgs:
			t.Stop()
			if !ok { // holdfast died: nobody renews, nobody escalates
				if id != 0 { // else CMD did not start, or the kernel kills it (Pdeathsig)
					act(actKill, syscall.SIGKILL)
				}
				return 0
			}
			switch m[0] {
			case msgStandDown:
				return 0
			case msgDeadline:
				fed, jobStopped = monoNow(), false
				if !termed {
					deadline = int64(binary.BigEndian.Uint64(m[1:]))
				}
			case msgJobStop:
				jobStopped = true
			case msgGroup:
				id = int(binary.BigEndian.Uint64(m[1:]))
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
	// acted gets what the guard did (actTerm, actKill); closed when the
	// guard ends.
	acted chan byte
}

// startGuarded starts cmd in its own process group, stopped by the kernel
// (Linux) should holdfast die, and by a guard process should holdfast die
// or the deadline it feeds (see guard.feed) come near: SIGTERM grace
// before it, SIGKILL just before. If the guard cannot be started, CMD
// still runs; the returned warning says what is missing. With a guard, CMD
// starts as shim: its exec's error is shim.execErr's.
//
// m is CMD's membership of jobCtl (see jobControl.start).
func startGuarded(cmd *exec.Cmd, grace time.Duration, m *jobMember) (g *guard, shim *shimStart, warning error, err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	setParentDeathSignal(cmd.SysProcAttr)
	if cmd.Err != nil { // not found: nothing to start
		return nil, nil, nil, cmd.Err
	}
	err = jobCtl.start(m, func() (int, *guard, error) {
		// The guard first, with the deadline as CMD starts: it knows one
		// before CMD runs, whether or not holdfast runs again to feed it.
		deadline := monoNow() + int64(time.Until(m.g.Deadline()))
		g, warning = newGuard(grace, deadline)
		if g != nil { // CMD starts as a shim, let go once the guard knows its group (shim.go)
			var shimEnds []*os.File
			if shim, shimEnds, err = asShim(cmd); err != nil {
				g.standDown()
				return 0, nil, err
			}
			defer closeAll(shimEnds)
		}
		onStarterThread(func() {
			if err = cmd.Start(); err == nil {
				g.send(msgGroup, int64(cmd.Process.Pid))
				shim.letGo()
			}
		})
		if err != nil {
			if shim != nil {
				shim.abandon()
			}
			g.standDown()
			return 0, nil, err
		}
		return cmd.Process.Pid, g, nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	return g, shim, warning, nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

func newGuard(grace time.Duration, deadline int64) (*guard, error) {
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
	rr, rw, err := os.Pipe()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("no guard for the command (it may outlive a killed or stopped holdfast): %w", err)
	}
	defer rw.Close()
	p := exec.Command(exe)
	p.Args = []string{guardArg0}
	p.Env = []string{guardEnv + "=" + strconv.FormatInt(int64(grace), 10) + "," + strconv.FormatInt(deadline, 10)}
	if m, ok := os.LookupEnv("HOLDFAST_MUTANT"); ok { // a mutant build's guard removes the same guard
		p.Env = append(p.Env, "HOLDFAST_MUTANT="+m)
	}
	p.ExtraFiles = []*os.File{r, rw}
	p.Stderr = os.Stderr
	p.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := p.Start(); err != nil {
		w.Close()
		rr.Close()
		return nil, fmt.Errorf("no guard for the command (it may outlive a killed or stopped holdfast): %w", err)
	}
	g := &guard{proc: p, w: w, acted: make(chan byte, 2)}
	go func() {
		defer close(g.acted)
		defer rr.Close()
		var b [1]byte
		for {
			if _, err := rr.Read(b[:]); err != nil {
				return
			}
			g.acted <- b[0]
		}
	}()
	return g, nil
}

// actions is what the guard did, or nil (no guard).
func (g *guard) actions() <-chan byte {
	if g == nil {
		return nil
	}
	return g.acted
}

func (g *guard) send(op byte, v int64) {
	if g == nil {
		return
	}
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
