package main

import (
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/holdfast/holdfast/internal/mutant"
)

// setParentDeathSignal makes the kernel send the child SIGKILL when the
// thread that started it (see onStarterThread) exits, that is when
// holdfast dies.
func setParentDeathSignal(a *syscall.SysProcAttr) {
	if !mutant.On("cmd/parent-death-signal") {
		a.Pdeathsig = syscall.SIGKILL
	}
}

// selfExecutable is this process's own image, even if its file was
// replaced or removed since it started.
func selfExecutable() (string, error) { return "/proc/self/exe", nil }

// isTTY reports whether fd is a terminal.
func isTTY(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

// underJobControl reports whether holdfast's process group is a job of a
// shell with job control: its parent is in the same session and another
// process group. Otherwise (holdfast leads its session: ssh -t, docker
// run -t, systemd) nobody would resume a stopped holdfast, and the kernel
// itself ignores terminal stops for such an orphaned group.
func underJobControl() bool {
	ppid := os.Getppid()
	psid, err := unix.Getsid(ppid)
	if err != nil {
		return false
	}
	sid, err := unix.Getsid(0)
	if err != nil {
		return false
	}
	ppg, err := unix.Getpgid(ppid)
	return err == nil && psid == sid && ppg != unix.Getpgrp()
}

// terminalGroup is the foreground process group of the terminal fd, or
// -1.
func terminalGroup(fd int) int {
	pg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
	if err != nil {
		return -1
	}
	return pg
}

// setTerminalGroup makes pgid the foreground process group of the
// terminal fd. SIGTTOU, which the kernel sends a background process
// group that tries, is ignored meanwhile (a handled one would make the
// call restart for ever); no child is started meanwhile, so none
// inherits the disposition.
func setTerminalGroup(fd, pgid int) {
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	_ = unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, pgid)
}

// childStopped reports whether the child pid has stopped (by SIGTSTP,
// SIGTTIN, SIGTTOU or SIGSTOP) since last asked. It leaves the child's
// exit to be reaped by whoever waits for it.
func childStopped(pid int) bool {
	const cldStopped = 5 // CLD_STOPPED
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WSTOPPED|unix.WNOHANG, nil); err != nil {
		return false
	}
	return info.Signo == int32(syscall.SIGCHLD) && info.Code == cldStopped
}

// groupAlive reports whether a process of the process group pgid still
// runs: a zombie, which a parent that never waits (a container's PID 1)
// may leave for good, does not count.
func groupAlive(pgid int) bool {
	if syscall.Kill(-pgid, 0) != nil {
		return false
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		f := procStat(e.Name()) // state, ppid, pgrp...
		if len(f) > 2 && f[0] != "Z" && f[0] != "X" && f[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}

// childGroups lists the process groups led by a child of parent in its
// session (the CMDs holdfast started; a guard leads its own session).
func childGroups(parent int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f := procStat(e.Name()) // state, ppid, pgrp, session...
		if len(f) > 3 && f[1] == strconv.Itoa(parent) && f[2] == e.Name() && f[3] != e.Name() && pid != os.Getpid() {
			out = append(out, pid)
		}
	}
	return out
}

// procStat returns the fields of /proc/<pid>/stat after the command name
// (state, ppid, pgrp, session, ...), or nil if the process is gone.
func procStat(pid string) []string {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}
