package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"

	"github.com/holdfast/holdfast/internal/mutant"
)

// CMD must not outlive holdfast's grant, even when holdfast dies without
// a chance to act (kill -9, the OOM killer). Two mechanisms, both set up
// by startGuarded:
//
//  1. On Linux the kernel sends CMD itself SIGKILL when holdfast dies
//     (SysProcAttr.Pdeathsig, see guard_linux.go).
//  2. On every Unix, a guard process (this binary run again, in its own
//     session, ignoring the signals a terminal or holdfast's group gets)
//     holds the read end of a pipe whose write end only holdfast has. When
//     holdfast dies the kernel closes the write end; the guard reads EOF
//     and sends SIGKILL to CMD's whole process group, which reaches what
//     CMD started too. When CMD has exited, holdfast writes one byte and
//     the guard exits without killing.
//
// SIGKILL rather than SIGTERM: once holdfast is gone nobody can escalate
// after --kill-grace, and the grant expires within the session TTL; a CMD
// that traps SIGTERM would run on unprotected.

// guardEnv names the environment variable that makes this binary a guard:
// its value is the process group to kill.
const guardEnv = "HOLDFAST_INTERNAL_GUARD_PGID"

func init() {
	if v, ok := os.LookupEnv(guardEnv); ok {
		os.Exit(guardMain(v))
	}
}

// guardMain is the guard process: it waits on fd 3 and kills the process
// group pgid if the pipe ends without holdfast's stand-down byte.
func guardMain(pgid string) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE)
	id, err := strconv.Atoi(pgid)
	if err != nil || id <= 1 {
		return 2
	}
	f := os.NewFile(3, "holdfast-guard")
	var b [1]byte
	if n, _ := f.Read(b[:]); n == 1 {
		return 0 // CMD exited and holdfast stood the guard down
	}
	_ = syscall.Kill(-id, syscall.SIGKILL)
	return 0
}

// guard is a running guard process, stood down with standDown.
type guard struct {
	proc *exec.Cmd
	w    *os.File
}

// startGuarded starts cmd in its own process group, stopped by the kernel
// (Linux) and by a guard process should holdfast die. If the guard cannot
// be started, CMD still runs; the returned warning says what is missing.
func startGuarded(cmd *exec.Cmd) (g *guard, warning error, err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	setParentDeathSignal(cmd.SysProcAttr)
	onStarterThread(func() { err = cmd.Start() })
	if err != nil {
		return nil, nil, err
	}
	g, warning = newGuard(cmd.Process.Pid)
	return g, warning, nil
}

func newGuard(pgid int) (*guard, error) {
	if mutant.On("cmd/kill-guard") {
		return nil, nil
	}
	exe, err := selfExecutable()
	if err != nil {
		return nil, fmt.Errorf("no guard for the command (it may outlive a killed holdfast): %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("no guard for the command (it may outlive a killed holdfast): %w", err)
	}
	defer r.Close()
	p := exec.Command(exe)
	p.Env = []string{guardEnv + "=" + strconv.Itoa(pgid)}
	p.ExtraFiles = []*os.File{r}
	p.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := p.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("no guard for the command (it may outlive a killed holdfast): %w", err)
	}
	return &guard{proc: p, w: w}, nil
}

// standDown tells the guard that CMD has exited and waits for it to go.
func (g *guard) standDown() {
	if g == nil {
		return
	}
	_, _ = g.w.Write([]byte{1})
	g.w.Close()
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
