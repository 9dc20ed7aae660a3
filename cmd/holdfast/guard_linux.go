package main

import (
	"os/signal"
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

// foregroundTerminal reports whether fd is a terminal whose foreground
// process group is holdfast's: then CMD gets the terminal.
func foregroundTerminal(fd int) bool {
	if _, err := unix.IoctlGetTermios(fd, unix.TCGETS); err != nil {
		return false
	}
	pg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
	return err == nil && pg == unix.Getpgrp()
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
