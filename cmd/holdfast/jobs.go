package main

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/mutant"
)

// Job control is process-wide: one Ctrl-Z (SIGTSTP, or a CMD stopped by
// its terminal) stops every CMD holdfast runs and holdfast itself, as one
// shell job, and one fg (SIGCONT) resumes all of them. holdfast shard
// runs one CMD per owned shard; had each stopped holdfast on its own, the
// shell would need one fg per shard. jobCtl is the one coordinator: every
// runUnder joins it while its CMD runs.
var jobCtl jobControl

// jobMember is one CMD under jobCtl.
type jobMember struct {
	pid   int // CMD's pid and process group; 0 until it started
	tty   int // CMD's terminal (its stdin, holdfast's), or -1
	jobs  bool
	g     holdfast.Grant
	guard *guard
}

type jobControl struct {
	mu        sync.Mutex
	members   map[*jobMember]bool
	sigs      chan os.Signal // SIGTSTP, SIGCHLD while a member runs
	conts     chan os.Signal // SIGCONT
	started   bool
	suspended bool // between stopping the members and resuming them
}

// join makes m a member: from now on SIGTSTP stops holdfast with every
// member instead of holdfast alone. Call it before starting m's CMD (with
// start).
func (c *jobControl) join(m *jobMember) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		c.started = true
		c.members = map[*jobMember]bool{}
		c.sigs = make(chan os.Signal, 8)
		c.conts = make(chan os.Signal, 1)
		go c.run()
	}
	if len(c.members) == 0 {
		signal.Notify(c.sigs, syscall.SIGTSTP, syscall.SIGCHLD)
		signal.Notify(c.conts, syscall.SIGCONT)
	}
	c.members[m] = true
}

// start runs start (which starts m's CMD and its guard, and returns its
// pid) with the members held still: a stop either comes before it, and
// m's CMD is then stopped with the others, or after, and sees it.
func (c *jobControl) start(m *jobMember, start func() (int, *guard, error)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	pid, g, err := start()
	if err != nil {
		return err
	}
	m.pid, m.guard = pid, g
	if c.suspended {
		_ = syscall.Kill(-pid, syscall.SIGSTOP)
		g.jobStop()
	}
	return nil
}

// leave ends m's membership; with no member left, SIGTSTP stops holdfast
// alone again.
func (c *jobControl) leave(m *jobMember) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.members, m)
	if len(c.members) == 0 && !c.suspended {
		signal.Stop(c.sigs)
		signal.Stop(c.conts)
	}
}

func (c *jobControl) run() {
	for sig := range c.sigs {
		stop := sig == syscall.SIGTSTP // kill -TSTP, or Ctrl-Z with the terminal not a CMD's
		c.mu.Lock()
		for m := range c.members {
			// Ctrl-Z, or a read of the terminal in the background.
			if m.pid == 0 || m.tty < 0 || !childStopped(m.pid) {
				continue
			}
			switch {
			case m.jobs: // a shell's job: stopped as one, resumed by fg or bg
				stop = true
			case terminalGroup(m.tty) == m.pid: // Ctrl-Z with no shell to resume us: it does nothing
				_ = syscall.Kill(-m.pid, syscall.SIGCONT)
			}
		}
		c.mu.Unlock()
		if stop {
			c.suspend()
		}
	}
}

// suspend stops every member's CMD and holdfast (its job, for a shell)
// until SIGCONT, then resumes each CMD whose grant is still held, and
// kills the others' process groups.
func (c *jobControl) suspend() {
	c.mu.Lock()
	c.suspended = true
	for m := range c.members {
		if m.pid == 0 {
			continue
		}
		_ = syscall.Kill(-m.pid, syscall.SIGSTOP)
		m.guard.jobStop()
		if m.tty >= 0 && terminalGroup(m.tty) == m.pid {
			setTerminalGroup(m.tty, syscall.Getpgrp())
		}
	}
	for len(c.conts) > 0 {
		<-c.conts
	}
	c.mu.Unlock()
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	<-c.conts
	c.mu.Lock()
	defer c.mu.Unlock()
	c.suspended = false
	for m := range c.members {
		if m.pid == 0 {
			continue
		}
		m.guard.jobResume()
		if m.g.Context().Err() != nil { // lost while stopped: the command must not run on
			_ = syscall.Kill(-m.pid, syscall.SIGKILL)
			continue
		}
		if m.tty >= 0 && terminalGroup(m.tty) == syscall.Getpgrp() { // fg, not bg
			setTerminalGroup(m.tty, m.pid)
		}
		_ = syscall.Kill(-m.pid, syscall.SIGCONT)
	}
	if len(c.members) == 0 {
		signal.Stop(c.sigs)
		signal.Stop(c.conts)
	}
}

// stopUntilContinued stops holdfast (SIGSTOP; a shell shows its job
// Stopped) and returns once SIGCONT (fg, bg, kill -CONT) has resumed it.
// The kill returns before the stop has taken every thread: without the
// wait, the caller went on for a moment, long enough to start the next
// session's timeouts and deadlines, which the stop then ran down (a stop
// longer than the TTL: fg exited 125 with "context deadline exceeded").
// After it, whatever the caller measures starts after the stop. It also
// returns once ctx ends (holdfast is being stopped for good).
func stopUntilContinued(ctx context.Context) {
	if mutant.On("cmd/tstp-await-cont") {
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		return
	}
	conts := make(chan os.Signal, 1)
	signal.Notify(conts, syscall.SIGCONT)
	defer signal.Stop(conts)
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	select {
	case <-conts:
	case <-ctx.Done():
	}
}
