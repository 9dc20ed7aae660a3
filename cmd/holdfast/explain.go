package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/holdfast/holdfast"
)

// explained is an error whose message the command wrote for the user (the
// name once, what happened, the store's detail), wrapping the original.
type explained struct {
	msg string
	err error
}

func (e explained) Error() string { return e.msg }
func (e explained) Unwrap() error { return e.err }

func explainf(err error, format string, args ...any) error {
	return explained{fmt.Sprintf(format, args...), err}
}

// detail is what err says after the sentinel's own message, without the
// name it repeats: "has 4 of 2 permits taken or waited for" out of
// "holdfast/etcd: lock a: holdfast: locked by another holder: a has 4 of
// 2 permits taken or waited for". It is "" if err adds nothing.
func detail(err, sentinel error, name string) string {
	s, key := err.Error(), sentinel.Error()
	i := strings.LastIndex(s, key)
	if i < 0 {
		return s
	}
	d := strings.TrimPrefix(s[i+len(key):], ": ")
	for _, p := range []string{"semaphore " + name + ": ", "semaphore " + name + " ", name + ": ", name + " "} {
		if strings.HasPrefix(d, p) {
			return d[len(p):]
		}
	}
	if d == name {
		return ""
	}
	return d
}

// explain turns the error that ended an attempt on name into the
// command's error and exit status: usage and input errors found before any
// request exit 2 (see the exit status table), not acquired 124, anything
// else 125. where names the store.
func explain(err error, name, where string) error {
	var ue usageError
	var ee exitError
	switch {
	case errors.As(err, &ue), errors.As(err, &ee):
		return err
	case errors.Is(err, holdfast.ErrInvalidArgument):
		// Checked before any request (the library's contract).
		return usageError{detail(err, holdfast.ErrInvalidArgument, "")}
	case errors.Is(err, holdfast.ErrLocked):
		d := detail(err, holdfast.ErrLocked, name)
		if d == "" {
			d = "held or waited for by another holder"
		}
		return exitError{exitNotAcquired, explainf(err, "%s: not acquired: %s", name, d)}
	case errors.Is(err, errTimeout):
		return exitError{exitNotAcquired, explainf(err, "%s: not acquired: %v", name, err)}
	case errors.Is(err, holdfast.ErrLimitMismatch):
		return exitError{exitFailed, explainf(err, "%s: semaphore limit mismatch: %s", name, detail(err, holdfast.ErrLimitMismatch, name))}
	case errors.Is(err, holdfast.ErrConflict):
		return exitError{exitFailed, explainf(err, "%s: in use by another kind of lock or a longer name: %s", name, detail(err, holdfast.ErrConflict, name))}
	case errors.Is(err, holdfast.ErrPermissionDenied):
		return exitError{exitFailed, explainf(err, "%s: %s refused: permission denied: %s", name, where, detail(err, holdfast.ErrPermissionDenied, name))}
	case errors.Is(err, context.Canceled):
		return exitError{exitFailed, explainf(err, "%s: stopped: %v", name, err)}
	default:
		return exitError{exitFailed, explainf(err, "%s: %s: %v", name, where, err)}
	}
}

// lossReason says why a grant was lost, without the sentinels' prefixes:
// "jobs/x/13b0... was deleted (lease revoked or key removed)", "session
// lost: ...".
func lossReason(cause error) string {
	if errors.Is(cause, holdfast.ErrLost) {
		if d := detail(cause, holdfast.ErrLost, ""); d != "" {
			return d
		}
	}
	return cause.Error()
}
