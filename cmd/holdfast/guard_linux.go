package main

import (
	"syscall"

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
