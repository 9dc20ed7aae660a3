package embedtest

import "syscall"

// procAttr makes the kernel kill a started server if this process dies
// without closing it (e.g. a test binary killed by its timeout).
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
