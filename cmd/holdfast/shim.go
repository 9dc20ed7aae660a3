package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/holdfast/holdfast/internal/mutant"
)

// CMD starts in two steps, so that it never runs before the guard knows its
// process group. startGuarded starts this binary as a shim, with CMD's
// process attributes (its own process group, the terminal, the
// parent-death signal, its files and environment), tells the guard the
// shim's process group, and only then lets the shim go on: the shim execs
// CMD in place, same process, same group. A holdfast killed before that
// leaves a shim that reads the end of its gate (or is killed by its
// parent-death signal) and exits: CMD never ran, so no child of CMD can
// outlive holdfast unseen by the guard.

// shimEnv names the environment variable that makes this binary a shim;
// its value is "GATE,STATUS", the shim's two descriptors. The shim drops
// it from CMD's environment.
const shimEnv = "HOLDFAST_INTERNAL_SHIM"

// shimGo is the one byte on the gate that lets the shim exec CMD, and
// shimArg0 the shim's argv[0], which it must have too (a user's
// environment with shimEnv alone does not make holdfast a shim).
const (
	shimGo   = 'g'
	shimArg0 = "holdfast-shim"
)

func init() {
	if v, ok := os.LookupEnv(shimEnv); ok && os.Args[0] == shimArg0 {
		os.Exit(shimMain(v))
	}
}

// shimMain is the shim: it waits on its gate (fd GATE) for shimGo, then
// execs os.Args[1] with the arguments os.Args[2:] and its environment
// without shimEnv. If the gate ends without shimGo, it exits 127 without
// running anything. If the exec fails, it writes the errno, a big-endian
// uint32, on fd STATUS (closed by a successful exec) and exits 127.
func shimMain(arg string) int {
	var gate, status int
	if _, err := fmt.Sscanf(arg, "%d,%d", &gate, &status); err != nil || len(os.Args) < 3 {
		return 2
	}
	if !mutant.On("cmd/shim-gate") {
		var b [1]byte
		if n, _ := os.NewFile(uintptr(gate), "holdfast-shim-gate").Read(b[:]); n != 1 || b[0] != shimGo {
			return exitNotFound // holdfast is gone: CMD must not start
		}
	}
	shimPause()
	syscall.CloseOnExec(gate)
	syscall.CloseOnExec(status)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, shimEnv+"=") })
	err := syscall.Exec(os.Args[1], os.Args[2:], env)
	errno, ok := err.(syscall.Errno)
	if !ok {
		errno = syscall.EINVAL
	}
	var m [4]byte
	binary.BigEndian.PutUint32(m[:], uint32(errno))
	_, _ = os.NewFile(uintptr(status), "holdfast-shim-status").Write(m[:])
	return exitNotFound
}

// shimStart is a CMD started as a shim and not yet let go.
type shimStart struct {
	path   string
	gate   *os.File      // the gate's write end; nil once let go
	status *os.File      // the read end of the shim's exec status
	result chan error    // the exec's outcome, once let go (see execErr)
	done   chan struct{} // closed once result is there
}

// asShim rewrites cmd, not yet started, to start as a shim that execs
// CMD once let go (see shimStart.letGo). closeAfterStart are the shim's
// ends of its pipes, for the caller to close once cmd has started, or
// failed to.
func asShim(cmd *exec.Cmd) (s *shimStart, closeAfterStart []*os.File, err error) {
	exe, err := selfExecutable()
	if err != nil {
		return nil, nil, err
	}
	gr, gw, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	sr, sw, err := os.Pipe()
	if err != nil {
		gr.Close()
		gw.Close()
		return nil, nil, err
	}
	fd := 3 + len(cmd.ExtraFiles)
	cmd.ExtraFiles = append(cmd.ExtraFiles, gr, sw)
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(slices.Clip(env), shimEnv+"="+strconv.Itoa(fd)+","+strconv.Itoa(fd+1))
	s = &shimStart{path: cmd.Path, gate: gw, status: sr}
	cmd.Args = append([]string{shimArg0, cmd.Path}, cmd.Args...)
	cmd.Path = exe
	return s, []*os.File{gr, sw}, nil
}

// abandon ends the gate without letting the shim go: it exits without
// running CMD.
func (s *shimStart) abandon() {
	if s.gate != nil {
		s.gate.Close()
		s.gate = nil
	}
	s.status.Close()
}

// letGo lets the shim exec CMD, without waiting for the exec: a shim
// stopped (Ctrl-Z) before its exec is a stopped CMD to holdfast, which
// goes on renewing and feeding the guard. Nothing on a nil s.
func (s *shimStart) letGo() {
	if s == nil {
		return
	}
	_, _ = s.gate.Write([]byte{shimGo}) // fails only if the shim is gone: cmd.Wait says how
	s.gate.Close()
	s.gate = nil
	s.result, s.done = make(chan error, 1), make(chan struct{})
	go func() {
		defer close(s.done)
		defer s.status.Close()
		var m [4]byte
		if n, _ := io.ReadFull(s.status, m[:]); n == len(m) {
			s.result <- &os.PathError{Op: "fork/exec", Path: s.path, Err: syscall.Errno(binary.BigEndian.Uint32(m[:]))}
			return
		}
		s.result <- nil // exec'd, or the shim was killed before: cmd.Wait says how
	}()
}

// execDone is closed once the shim let go has exec'd CMD or ended; nil
// (never ready) on a nil s. Until then a signal for CMD would reach the
// shim, holdfast's own runtime, which ignores USR1 and dumps its
// goroutines on QUIT: runUnder holds them back.
func (s *shimStart) execDone() <-chan struct{} {
	if s == nil {
		return nil
	}
	return s.done
}

// execErr waits for the exec of a shim let go, and returns its error, in
// the form exec.Cmd.Start gives it: nil once CMD runs, or the shim ended
// without an exec error. Nil on a nil s.
func (s *shimStart) execErr() error {
	if s == nil {
		return nil
	}
	return <-s.result
}
