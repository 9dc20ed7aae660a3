//go:build !linux

package main

import (
	"os"
	"syscall"
)

// setParentDeathSignal does nothing: only Linux has a parent-death
// signal. The guard process alone stops CMD's group if holdfast dies; if
// the guard is killed too, CMD runs on and the fencing token is the
// defence.
func setParentDeathSignal(*syscall.SysProcAttr) {}

// selfExecutable is the path this binary was started from.
func selfExecutable() (string, error) { return os.Executable() }

// isTTY is false: only on Linux does CMD get the terminal.
func isTTY(int) bool { return false }

func underJobControl() bool { return false }

func terminalGroup(int) int { return -1 }

func setTerminalGroup(int, int) {}

// childStopped is false: only on Linux does holdfast follow CMD's stops.
func childStopped(int) bool { return false }

// groupAlive reports whether a process of the process group pgid is
// still there (a zombie counts).
func groupAlive(pgid int) bool { return syscall.Kill(-pgid, 0) == nil }

// childGroups is empty: elsewhere the guard stops CMD only once holdfast
// told it CMD's process group.
func childGroups(int) []int { return nil }
