//go:build !linux

package embedtest

import "syscall"

// procAttr returns the attributes of started server processes (nothing
// special outside Linux).
func procAttr() *syscall.SysProcAttr { return nil }
