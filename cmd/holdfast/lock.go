package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/mutant"
)

// Exit statuses of lock (and elect) other than the child's own; documented
// in the command's usage. They follow timeout(1) where they can.
const (
	exitLost        = 122 // the grant was lost while the command ran; it was stopped
	exitNotAcquired = 124 // --timeout elapsed, or --try found the lock held
	exitFailed      = 125 // holdfast itself failed (store unreachable, refused...)
	exitCannotRun   = 126 // the command was found but could not be started
	exitNotFound    = 127 // the command was not found
)

// exitError ends a command with a given exit status; err, if not nil, is
// printed first.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e exitError) Unwrap() error { return e.err }

var lockCommand = &command{
	name:       "lock",
	summary:    "run a command while holding a lock",
	ownSignals: true,
	usage: `usage: holdfast lock [flags] NAME [flags] -- CMD [ARGS...]

Waits for the lock NAME (FIFO, behind earlier waiters), runs CMD while
holding it, and releases it when CMD exits. With -n N (N > 1) it waits for
one of N permits of the semaphore NAME instead; its layout is api.Semaphore's
on Consul, so "consul lock -n N NAME" shares the permits. If the lock is lost while CMD
runs (its session expired or was revoked, its key deleted), CMD is sent
SIGTERM, then SIGKILL after --kill-grace (at the grant's deadline if that
is sooner), and holdfast exits 122: the lock is noticed lost before another
client can be granted it.

With --and NAME2 (repeatable) it locks NAME, NAME2... as one grant: each an
ordinary lock of its name, taken in sorted order whatever the order given,
so two such commands never deadlock; the loss of any of them stops CMD.
HOLDFAST_KEY and HOLDFAST_TOKEN are then NAME's, and CMD also gets one
HOLDFAST_NAME_<i>, HOLDFAST_KEY_<i> and HOLDFAST_TOKEN_<i> per name in the
order of the command line (HOLDFAST_TOKEN_1 is NAME's, HOLDFAST_TOKEN_2 the
first --and name's...), and HOLDFAST_NAMES, HOLDFAST_KEYS and
HOLDFAST_TOKENS (comma-separated, in sorted order of the names); a write to
what one name protects is fenced by that name's token. A name given twice
is locked once, and its variables are set at each of its positions. The native tools'
variables are not set. With -v, holdfast names the name it waits on and
every name's token.

The key layout is the native one, so holdfast, "etcdctl lock NAME" and
"consul lock NAME" (and concurrency.Mutex, api.Lock on NAME/.lock) exclude
each other on the same name.

CMD gets, besides holdfast's own environment:
  HOLDFAST_NAME   the lock's name
  HOLDFAST_KEY    the holder's key in the store
  HOLDFAST_TOKEN  the fencing token: pass it with every write to a fenced
                  resource, which must reject tokens lower than one it saw
  ETCD_LOCK_KEY, ETCD_LOCK_REV  (etcd) as etcdctl lock sets them, for
                  drop-in use; ETCD_LOCK_REV is the key's create revision,
                  the same as HOLDFAST_TOKEN. Note that etcdctl lock itself
                  sets ETCD_LOCK_REV to the revision of its response, not the
                  create revision of its key, so etcdctl's value is not a
                  usable fencing token: scripts should use HOLDFAST_TOKEN.
  CONSUL_LOCK_HELD=true  (Consul) as consul lock sets it.

CMD runs in its own process group. SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1
and SIGUSR2 sent to holdfast are passed on to that group; holdfast releases
the lock once CMD exits, and once what CMD left running in its group (a
command run with &) is gone: that gets SIGTERM, then SIGKILL after the
kill grace (a process that left the group, setsid or a daemon, is not
reached). SIGINT, SIGTERM, SIGHUP and SIGQUIT are followed by SIGCONT (a
stopped CMD gets them) and, if CMD has not exited after --kill-grace, by
SIGKILL. While holdfast waits for the lock, SIGINT, SIGTERM, SIGHUP and
SIGQUIT stop the wait (nothing is left in the store) and holdfast exits
128+signal. Ctrl-Z (SIGTSTP, holdfast a shell's job) while waiting leaves
the queue (nothing is left in the store) and stops holdfast; fg waits
again, behind whoever came meanwhile.

With -v holdfast says on stderr where it waits, the token it got and that
it released; --metrics-addr serves Prometheus metrics and --log text|json
logs the session's events, for long runs.

With its stdin a terminal and holdfast in its foreground, CMD's group gets
the terminal: CMD reads it, and Ctrl-C reaches CMD (holdfast then releases
the lock and exits with CMD's status). If CMD died of SIGINT (Ctrl-C), or
SIGINT ended the wait for the lock, holdfast, once everything is released,
dies of SIGINT itself, as the shell's convention asks: a script that ran
holdfast stops there rather than going on (a shell reports 130). Ctrl-Z stops CMD and holdfast as one
job (so does SIGTSTP to holdfast); fg resumes both, unless the grant expired
meanwhile: CMD was then killed before its deadline and holdfast exits 122.
Without a shell's job control (holdfast leads its session: ssh -t), Ctrl-Z
does nothing.

CMD is dead by the grant's deadline (after which the store may grant the
lock to another client), whatever happens to holdfast. A guard process
started beside CMD knows the deadline (holdfast tells it every 100 ms;
each confirmed renewal, every TTL/3, moves it): when the deadline comes
within --kill-grace, but at most TTL/5 (and at most 7/15 TTL - 1 s: a
renewal 1 s late never stops CMD; below a TTL of about 2.1 s, no grace),
with no renewal moving it (the store silent to holdfast, or holdfast
stopped: SIGSTOP, a debugger), the guard sends CMD's group SIGTERM, then
SIGKILL just before the deadline, and holdfast exits 122, even if renewals
resumed meanwhile. The price: a store silent for 3/5 of the TTL (9 s at
the default 15 s) cuts CMD short, and CMD gets at most TTL/5 (3 s) of
--kill-grace then; a pause of holdfast or a late renewal that leaves the
deadline further away stops nothing. If
holdfast dies (kill -9), the guard sends SIGKILL at once (on Linux the
kernel also kills CMD). After a loss, holdfast waits at most 0.5 s for a
silent store, whose expiry releases the rest. See the README for what
remains.

Exit status:
  CMD's own       CMD ran and exited (128+N if it was killed by signal N;
                  SIGINT: holdfast dies of it too); 0 with
                  --child-exit-code=false
  2               a usage or input error, found before any request: a bad
                  flag or argument, a missing or invalid NAME, a TTL out of
                  the store's range, a flag of the other store
  122             the lock was lost while CMD ran, or its deadline came
                  near with no renewal confirmed, or the guard process
                  died; CMD was stopped
  124             not acquired: --timeout elapsed while waiting, or --try
                  found it held
  125             holdfast failed once it went to the store: unreachable or
                  silent within --timeout (or --try's bound, or while
                  waiting, for long enough that the session expired),
                  refused (permission, another kind of lock, a limit
                  mismatch)
  126, 127        CMD could not be started, CMD not found
  128+N           holdfast got signal N while waiting (SIGINT: holdfast
                  dies of it)`,
	flags: lockFlags,
}

func lockFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	sf := addStoreFlags(fs)
	vis := addVisibilityFlags(fs)
	timeout := fs.Duration("timeout", 0, "give up after this long, connecting included: exiting 124 if the lock was not granted in time, 125 if the store did not answer (0: wait as long as it takes)")
	try := fs.Bool("try", false, "fail at once, exiting 124, if the lock is held or waited for; the attempt, connecting included, is bounded by --timeout, else "+tryBound.String())
	grace := fs.Duration("kill-grace", 10*time.Second, "when the lock is lost (or a stop signal was passed on), how long CMD has between SIGTERM and SIGKILL; never past the grant's deadline, and at most TTL/5 when the store confirms no renewal (see above)")
	childCode := fs.Bool("child-exit-code", true, "exit with CMD's exit status; false: exit 0 whenever CMD ran")
	permits := fs.Int("n", 1, "hold one of `N` permits of the semaphore NAME instead of the lock (as consul lock -n N)")
	var also nameList
	fs.Var(&also, "and", "also lock `NAME2` (repeatable): all the names as one grant, taken in sorted order (no deadlock); HOLDFAST_TOKEN_<i> (and _NAME_, _KEY_) per name in command-line order, HOLDFAST_NAMES, HOLDFAST_KEYS, HOLDFAST_TOKENS list them")
	return func(ctx context.Context, e *env, args []string) error {
		name, argv, err := splitCommand(ctx, args)
		if err != nil {
			return err
		}
		switch {
		case *permits < 1:
			return usagef("-n %d: want at least 1", *permits)
		case *timeout < 0:
			return usagef("--timeout %v is negative", *timeout)
		case *grace < 0:
			return usagef("--kill-grace %v is negative", *grace)
		}
		if err := holdfast.ValidateName(name); err != nil {
			return explain(err, name, "")
		}
		if len(also) > 0 && *permits > 1 {
			return usagef("--and and -n exclude each other")
		}
		for _, n := range also {
			if err := holdfast.ValidateName(n); err != nil {
				return explain(err, n, "")
			}
		}
		stop, err := vis.start(e, sf)
		if err != nil {
			return err
		}
		defer stop()
		r := runner{e: e, what: "the lock", grace: *grace, childCode: *childCode, native: len(also) == 0, bound: *timeout, try: *try, verbose: *vis.verbose, also: also}
		if *permits > 1 {
			r.what = "its permit"
		}
		if *try && r.bound == 0 {
			r.bound = tryBound
		}
		return r.run(ctx, sf, func(ctx context.Context, s *session) (holdfast.Grant, error) {
			if len(also) > 0 {
				return multiLock(ctx, s, name, also, *try)
			}
			var l holdfast.Locker
			var err error
			if *permits > 1 {
				l, err = s.semaphore(name, *permits)
			} else {
				l, err = s.mutex(name)
			}
			if err != nil {
				return nil, err
			}
			if *try {
				return l.TryLock(ctx)
			}
			return l.Lock(ctx)
		}, name, argv)
	}
}

// tryBound bounds an attempt with --try and no --timeout, connecting
// included: a store that does not answer within it is a failure (125).
const tryBound = 2 * time.Second

var errTimeout = errors.New("timed out waiting")

// splitCommand splits the positional arguments "NAME CMD [ARGS...]" (the
// flags, before or after NAME, are taken by the parser; "--" before CMD is
// needed only when CMD has options of its own).
func splitCommand(ctx context.Context, args []string) (name string, argv []string, err error) {
	dash := argsBeforeDash(ctx)
	switch {
	case len(args) == 0:
		return "", nil, usagef("missing NAME and the command to run")
	case dash == 0:
		return "", nil, usagef("missing NAME before -- %s", args[0])
	case dash > 1:
		return "", nil, usagef("one NAME before --, got %d arguments: %q", dash, args[:dash])
	case len(args) == 1:
		return "", nil, usagef("missing the command to run after NAME %s", args[0])
	case args[1] == "":
		return "", nil, usagef("the command to run after NAME %s is an empty string", args[0])
	}
	return args[0], args[1:], nil
}

// runner runs a command under a grant.
type runner struct {
	e         *env
	what      string // "the lock", "a permit", "leadership": for messages
	grace     time.Duration
	childCode bool
	loop      bool // after a loss, acquire again (elect --loop)
	// bound, if not 0, bounds the first attempt: connecting and acquiring.
	// When it ends while connecting, or with try while acquiring, the
	// store did not answer (125); otherwise the wait timed out (124).
	bound    time.Duration
	try      bool
	verbose  bool // -v: say what happens on stderr
	extraEnv []string
	native   bool // set the native lock commands' variables too
	// unrenewed: the grant is never renewed (once's claim): its deadline
	// is fixed when CMD starts.
	unrenewed bool
	also      []string // lock --and: the other names (for -v)
}

// stopSignals end a wait for a grant; forwarded are passed on to the child.
var (
	stopSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}
	forwarded   = append(stopSignals[:len(stopSignals):len(stopSignals)], syscall.SIGUSR1, syscall.SIGUSR2)
)

// run opens a session, gets a grant with acquire, runs argv under it and
// releases it; the returned error carries the exit status. With r.loop, a
// loss while argv runs is followed by a new acquisition.
func (r runner) run(ctx context.Context, sf *storeFlags, acquire func(context.Context, *session) (holdfast.Grant, error), name string, argv []string) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	var s *session
	var err error
	defer func() {
		var ee exitError
		if s != nil {
			closeSession(s, errors.As(err, &ee) && ee.code == exitLost)
		}
	}()
	var got os.Signal
	actx, cancelAttempt := ctx, context.CancelFunc(func() {})
	if r.bound > 0 {
		actx, cancelAttempt = context.WithTimeoutCause(ctx, r.bound, errTimeout)
	}
	defer cancelAttempt()
	timedOut := func() bool { return errors.Is(context.Cause(actx), errTimeout) && ctx.Err() == nil }
	for err == nil {
		if s != nil && s.Err() != nil { // lost with the grant: a new one
			closeSession(s, true)
			s = nil
		}
		if s == nil {
			if got, err = waitFor(actx, sigs, func(wctx context.Context) (err error) {
				s, err = sf.open(wctx)
				return err
			}); err != nil || got != nil { // a stop signal as the session opened: no wait
				if err != nil && got == nil && timedOut() {
					err = exitError{exitFailed, explainf(err, "%s: %s did not answer within %v: %v", name, sf.describe(), r.bound, err)}
				}
				break
			}
		}
		var g holdfast.Grant
		began := time.Now()
		answered, stopProbe := r.probeLate(actx, s, name)
		var paused atomic.Bool
		got, err = waitFor(actx, sigs, func(wctx context.Context) (err error) {
			if underJobControl() && !mutant.On("cmd/tstp-withdraw") {
				// Ctrl-Z (SIGTSTP) while waiting: leave the queue, so
				// that a stopped waiter blocks nobody, then stop; fg
				// joins it again, at its end.
				tstp := make(chan os.Signal, 1)
				signal.Notify(tstp, syscall.SIGTSTP)
				defer func() {
					signal.Stop(tstp)
					select {
					case <-tstp: // came after the watcher below left
						paused.Store(true)
					default:
					}
				}()
				var cancel context.CancelFunc
				wctx, cancel = context.WithCancel(wctx)
				defer cancel()
				go func() {
					select {
					case <-tstp:
						paused.Store(true)
						cancel()
					case <-wctx.Done():
					}
				}()
			}
			if r.verbose {
				pctx, cancel := context.WithCancel(wctx)
				reported := make(chan struct{})
				go func() { defer close(reported); r.reportPosition(pctx, s, r.waitNames(name)) }()
				defer func() { cancel(); <-reported }()
			}
			g, err = acquire(wctx, s)
			return err
		})
		if err == nil && (got != nil || paused.Load()) {
			// A stop signal or Ctrl-Z came as the grant did: CMD does not
			// start, as if it had come a moment before.
			r.release(s, g, name)
			if got != nil {
				break
			}
			err = context.Canceled
		}
		if err != nil && got == nil && paused.Load() && ctx.Err() == nil && actx.Err() == nil {
			r.verbosef("%s: stopped (SIGTSTP): left the queue; on SIGCONT (fg) holdfast waits again, behind whoever came meanwhile", name)
			// The session goes too (a wait cancelled early may end it):
			// nothing is left in the store, and fg opens a new one.
			closeSession(s, true)
			s = nil
			stopUntilContinued(ctx)
			err = nil
			continue
		}
		if err == nil {
			stopProbe() // not while CMD runs
			r.verbosef("%s: acquired %s, %s, after %v", name, r.what, tokens(g), time.Since(began).Round(time.Millisecond))
		}
		if err != nil && got == nil && timedOut() {
			ok := answered()
			switch {
			case !ok:
				s.silent = true // its close is not waited for: --timeout bounds it all
			case r.try:
				// The store answers (one request of ours went unanswered):
				// the close goes out and is waited for, as after a loss.
				s.unanswered = true
			}
			if r.try || !ok {
				err = exitError{exitFailed, explainf(err, "%s: %s did not answer within %v: %v", name, sf.describe(), r.bound, err)}
			} else {
				err = fmt.Errorf("%w after %v", errTimeout, r.bound)
			}
		}
		actx = ctx // a later round (elect --loop) is not bounded
		if !r.loop && got == nil && ctx.Err() == nil && errors.Is(err, holdfast.ErrSessionLost) {
			// A waiter holds nothing: its session ended, not a grant.
			// At the safe deadline it is holdfast that gave the session
			// up: the store may still list it until its own expiry.
			cause := s.Err()
			if cause == nil {
				cause = err
			}
			if errors.Is(cause, core.ErrPastSafeDeadline) {
				err = exitError{exitFailed, explainf(err, "%s: stopped waiting: %s did not acknowledge the session's renewals in time, so holdfast gave the session up at its safe deadline, before it was granted (the store may keep it until it expires; nothing was held)", name, sf.describe())}
			} else {
				err = exitError{exitFailed, explainf(err, "%s: stopped waiting: the session on %s ended before it was granted: %s (nothing was held)", name, sf.describe(), detail(cause, holdfast.ErrSessionLost, name))}
			}
		}
		if r.loop && got == nil && ctx.Err() == nil && errors.Is(err, holdfast.ErrSessionLost) {
			// The session died with the leadership; the next round opens
			// a new one (after a pause, should the store refuse at once).
			closeSession(s, true)
			s, err = nil, nil
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err != nil {
			break
		}
		err = r.child(ctx, s, g, name, argv, sigs)
		var ee exitError
		if r.loop && errors.As(err, &ee) && ee.code == exitLost && ctx.Err() == nil {
			fmt.Fprintf(r.e.stderr, "holdfast: %v; campaigning again\n", ee.err)
			if errors.Is(ee.err, errStalled) { // still leader, maybe: a new session
				closeSession(s, true)
				s = nil
			}
			err = nil
			continue
		}
		return err
	}
	if got != nil {
		if got == syscall.SIGINT {
			interrupted.Store(true)
		}
		return exitError{128 + int(got.(syscall.Signal)), fmt.Errorf("%s: stopped waiting: got %v", name, got)}
	}
	return explain(err, name, sf.describe())
}

// lateProbe is how long before a bounded attempt's end probeLate asks
// the store (at most a quarter of the bound).
const lateProbe = 200 * time.Millisecond

// probeLate, for an attempt bounded by actx's deadline (--timeout or
// --try's), reads name from the store through s lateProbe before that
// deadline, bounded by lateProbe, while the attempt still waits. The
// returned function reports whether the store answered: a wait that runs
// out with the store silent is its failure (125), not a lock held too
// long (124), whenever the store went silent; and a timed-out attempt's
// session is closed, waited for, only if the store answered. Without a
// bound, it reports true. stop cancels a probe not yet due (the attempt
// succeeded).
func (r runner) probeLate(actx context.Context, s *session, name string) (answered func() bool, stop func()) {
	dl, ok := actx.Deadline()
	if !ok {
		return func() bool { return true }, func() {}
	}
	window := min(lateProbe, r.bound/4)
	res := make(chan bool, 1)
	t := time.AfterFunc(time.Until(dl)-window, func() {
		pctx, cancel := context.WithTimeout(context.Background(), window)
		defer cancel()
		res <- s.ping(pctx, name) == nil
	})
	return func() bool {
		if !t.Stop() { // the probe began: it ends with the bound
			w := time.NewTimer(window)
			defer w.Stop()
			select {
			case ok := <-res:
				return ok
			case <-w.C:
				return false
			}
		}
		return true // the attempt ended before the probe was due
	}, func() { t.Stop() }
}

// waitFor runs fn under a context that a stop signal (see stopSignals)
// cancels, and returns that signal if one came.
func waitFor(ctx context.Context, sigs <-chan os.Signal, fn func(context.Context) error) (os.Signal, error) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var got os.Signal
	finished, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case sig := <-sigs:
				if isStop(sig) {
					got = sig
					cancel(fmt.Errorf("got %v", sig))
					return
				}
			case <-finished:
				return
			}
		}
	}()
	err := fn(wctx)
	close(finished)
	<-watched
	return got, err
}

func isStop(sig os.Signal) bool {
	for _, s := range stopSignals {
		if s == sig {
			return true
		}
	}
	return false
}

// child runs argv while g is held, then releases g.
func (r runner) child(ctx context.Context, s *session, g holdfast.Grant, name string, argv []string, sigs <-chan os.Signal) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "HOLDFAST_NAME="+name, "HOLDFAST_KEY="+g.Key(), "HOLDFAST_TOKEN="+g.Token().String())
	if r.native {
		cmd.Env = append(cmd.Env, s.nativeEnv(g)...)
	}
	if ge, ok := g.(interface{ Env() []string }); ok { // a multi-name grant lists every name
		cmd.Env = append(cmd.Env, ge.Env()...)
	}
	cmd.Env = append(cmd.Env, r.extraEnv...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, r.e.stdout, r.e.stderr
	p := policing{name: name, what: r.what, grace: r.grace, stderr: r.e.stderr, sigs: sigs}
	if !r.unrenewed {
		p.ttl = s.TTL()
	}
	werr, lostCause, err := runUnder(ctx, g, cmd, p)
	if err != nil {
		r.release(s, g, name)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitError{exitNotFound, fmt.Errorf("%s: %w", name, err)}
		}
		return exitError{exitCannotRun, fmt.Errorf("%s: %w", name, err)}
	}
	if lostCause != nil {
		return exitError{exitLost, explainf(lostCause, "%s: lost %s while the command ran: %s", name, r.what, lossReason(lostCause))}
	}
	r.release(s, g, name)
	code := 0
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
			if ws.Signal() == syscall.SIGINT && r.childCode {
				interrupted.Store(true)
			}
		}
	} else if werr != nil {
		return exitError{exitFailed, fmt.Errorf("%s: waiting for the command: %w", name, werr)}
	}
	if !r.childCode || code == 0 {
		return nil
	}
	return exitError{code: code}
}

// policing says how runUnder polices a command.
type policing struct {
	name, what string        // for messages: NAME and "the lock", "leadership"...
	grace      time.Duration // --kill-grace: between SIGTERM and SIGKILL
	// ttl is the session's TTL: with no renewal confirmed, CMD gets
	// termGrace(grace, ttl) before the grant's deadline. 0: the grant is
	// never renewed (a claim); its time left when CMD starts counts as
	// the TTL.
	ttl    time.Duration
	stderr io.Writer // where holdfast's messages go
	// sigs, if not nil, are signals to pass on to the command's process
	// group (see forwarded).
	sigs <-chan os.Signal
}

// runUnder starts cmd and runs it while g is held, and returns how it
// ended: cmd.Wait's error, and the cause of the grant's loss if it was
// lost before the command ended (the command was then stopped, SIGTERM
// then SIGKILL after p.grace, and its whole process group killed). It
// does not release g. err is not nil only if cmd could not be started.
//
// This is what every subcommand that runs a command under a grant uses
// (lock, elect): the command runs in its own process group, with the
// terminal if holdfast has it (stdin a terminal, holdfast in the
// foreground: Ctrl-C and Ctrl-Z reach the command); a guard process
// stops that group if holdfast dies or stops (SIGSTOP, Ctrl-Z) for too
// long to renew the grant, before the grant's deadline (see guard.go); a
// stop of the command by the terminal (Ctrl-Z) stops holdfast too, as a
// shell job, and SIGTSTP to holdfast stops the command; on SIGCONT both
// go on, unless the grant was lost meanwhile. ctx ending sends the
// command SIGTERM, as a signal would.
func runUnder(ctx context.Context, g holdfast.Grant, cmd *exec.Cmd, p policing) (werr, lostCause, err error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	tty := -1 // CMD's terminal, if its stdin is holdfast's and a terminal
	if cmd.Stdin == os.Stdin && isTTY(int(os.Stdin.Fd())) {
		tty = int(os.Stdin.Fd())
		if terminalGroup(tty) == syscall.Getpgrp() && !mutant.On("cmd/terminal") { // holdfast has it: CMD gets it
			cmd.SysProcAttr.Foreground, cmd.SysProcAttr.Ctty = true, tty
		}
	}
	member := &jobMember{tty: tty, jobs: tty >= 0 && underJobControl(), g: g}
	jobCtl.join(member)
	defer jobCtl.leave(member)

	if p.ttl == 0 {
		p.ttl = time.Until(g.Deadline())
	}
	guard, shim, warning, err := startGuarded(cmd, termGrace(p.grace, p.ttl), member)
	if tty >= 0 && cmd.Process != nil { // started, even if its exec failed
		pgid := cmd.Process.Pid
		defer func() {
			if terminalGroup(tty) == pgid { // the terminal back to holdfast's group
				setTerminalGroup(tty, syscall.Getpgrp())
			}
		}()
	}
	if err != nil {
		return nil, nil, err
	}
	if warning != nil {
		fmt.Fprintf(p.stderr, "holdfast: %s: %v\n", p.name, warning)
	}
	pgid := cmd.Process.Pid
	fed := make(chan struct{})
	stopFeed := make(chan struct{})
	go func() {
		defer close(fed)
		t := time.NewTicker(feedEvery)
		defer t.Stop()
		for {
			guard.feed(g.Deadline())
			select {
			case <-t.C:
			case <-stopFeed:
				return
			}
		}
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	lost := g.Context().Done()
	stop := ctx.Done()
	acted := guard.actions()
	var lastAct byte // the guard's last action; its pipe closes after actKill
	var kill <-chan time.Time
	execd := shim.execDone() // until CMD runs, signals for it are held
	var held []os.Signal
wait:
	for {
		select {
		case werr = <-done:
			break wait
		case a, ok := <-acted: // SIGTERM or SIGKILL: the guard stopped CMD for the deadline
			switch {
			case !ok && lastAct != actKill && groupAlive(pgid) && !mutant.On("cmd/guard-gone"):
				// The guard died (kill -9 of it alone) while CMD runs:
				// nothing would stop CMD by the deadline should holdfast
				// stop next. (A guard that left because CMD's group is
				// gone, as CMD exits, is not a death.)
				acted = nil
				if lostCause == nil {
					lostCause = errGuardGone
				}
				fmt.Fprintf(p.stderr, "holdfast: %s: %v; stopping the command\n", p.name, errGuardGone)
				_ = syscall.Kill(-pgid, syscall.SIGTERM)
				_ = syscall.Kill(-pgid, syscall.SIGCONT)
				if kill == nil {
					t := time.NewTimer(min(p.grace, time.Until(g.Deadline())))
					defer t.Stop()
					kill = t.C
				}
			case !ok:
				acted = nil
			default:
				lastAct = a
				if lostCause == nil && g.Context().Err() == nil {
					lostCause = errStalled
				}
			}
		case sig := <-p.sigs:
			if execd != nil { // not yet to CMD's shim: after its exec
				held = append(held, sig)
				continue
			}
			kill = passOn(pgid, sig, p.grace, kill)
		case <-execd:
			execd = nil
			for _, sig := range held {
				kill = passOn(pgid, sig, p.grace, kill)
			}
		case <-stop: // our caller gave up (in-process use): as a SIGTERM
			stop = nil
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			_ = syscall.Kill(-pgid, syscall.SIGCONT)
		case <-lost:
			lost = nil
			cause := context.Cause(g.Context())
			if lostCause == nil {
				lostCause = cause
			}
			fmt.Fprintf(p.stderr, "holdfast: %s: lost %s: %s; stopping the command\n", p.name, p.what, lossReason(cause))
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			_ = syscall.Kill(-pgid, syscall.SIGCONT) // a stopped command handles it too
			// SIGKILL after the grace, but by the grant's deadline (at
			// once if the loss is its passing).
			t := time.NewTimer(min(p.grace, time.Until(g.Deadline())))
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}
	if lostCause == nil && g.Context().Err() == nil && groupAlive(pgid) && !mutant.On("cmd/release-group") {
		// CMD exited, leaving processes in its group (a command run in
		// the background with &): they must not run on without the
		// grant, so they are stopped before the release.
		fmt.Fprintf(p.stderr, "holdfast: %s: the command exited, leaving processes in its process group: SIGTERM to them (SIGKILL after --kill-grace) before the release\n", p.name)
		stopGroup(pgid, min(p.grace, time.Until(g.Deadline())), p.sigs)
	}
	close(stopFeed)
	<-fed
	guard.standDown()
	if acted != nil { // what the guard did before it stood down: CMD may have ended of it
		for range acted {
			if lostCause == nil && g.Context().Err() == nil {
				lostCause = errStalled
			}
		}
	}
	if lostCause == nil && g.Context().Err() != nil && !errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) {
		lostCause = context.Cause(g.Context()) // lost as the command ended
	}
	if lostCause != nil {
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // nothing of the group runs on without the grant
	}
	if err := shim.execErr(); err != nil { // CMD never ran
		return nil, nil, err
	}
	return werr, lostCause, nil
}

// passOn passes sig on to the process group pgid. A request to stop: a
// stopped CMD gets it too (SIGCONT), and SIGKILL follows after grace
// (kill, if not yet set, is then when), so that a CMD stopped or deaf to
// it does not hold the grant for ever.
func passOn(pgid int, sig os.Signal, grace time.Duration, kill <-chan time.Time) <-chan time.Time {
	_ = syscall.Kill(-pgid, sig.(syscall.Signal))
	if isStop(sig) && !mutant.On("cmd/signal-escalation") {
		_ = syscall.Kill(-pgid, syscall.SIGCONT)
		if kill == nil {
			return time.After(grace)
		}
	}
	return kill
}

// stopGroup sends the process group pgid SIGTERM, then SIGKILL once grace
// has passed with a process of it still running; signals from sigs are
// passed on meanwhile.
func stopGroup(pgid int, grace time.Duration, sigs <-chan os.Signal) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	_ = syscall.Kill(-pgid, syscall.SIGCONT)
	kill := time.NewTimer(grace)
	defer kill.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for groupAlive(pgid) {
		select {
		case sig := <-sigs:
			_ = syscall.Kill(-pgid, sig.(syscall.Signal))
		case <-poll.C:
		case <-kill.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return
		}
	}
}

// errStalled is the loss runUnder reports when the guard stopped CMD
// because the grant's deadline came near with no renewal confirmed.
var errStalled = errors.New("the grant's deadline came near with no renewal moving it (the store did not answer, or holdfast could not run): the command was stopped to be gone by then")

// errGuardGone is the loss runUnder reports when the guard process died
// while CMD ran: CMD is stopped, as nothing would stop it by the grant's
// deadline should holdfast stop too.
var errGuardGone = errors.New("the guard process died (killed?), so nothing would stop the command by the grant's deadline if holdfast stopped: the command was stopped")

// lostCloseTimeout bounds the close of a session after a loss: the store
// may be silent (frozen, cut off), and what the close would remove it
// expires anyway, with the session's TTL.
const lostCloseTimeout = 500 * time.Millisecond

// closeSession closes s; after a loss (lost, or s itself ended) or a
// release the store did not answer, it waits at most lostCloseTimeout for
// the store, leaving the rest to the store's expiry.
func closeSession(s *session, lost bool) {
	if !lost && s.Err() == nil && !s.unanswered && !s.silent {
		s.Close()
		return
	}
	closed := make(chan struct{})
	go func() { defer close(closed); s.Close() }()
	wait := lostCloseTimeout
	if s.silent {
		wait = 0 // --timeout is the bound: the revoke goes out, unwaited for
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-closed:
	case <-t.C:
	}
}

// releaseTimeout bounds the release after the command exits; if the store
// does not answer in time, closing the session (revoking it) frees the lock.
const releaseTimeout = 5 * time.Second

func (r runner) release(s *session, g holdfast.Grant, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := g.Unlock(ctx); err != nil {
		if errors.Is(err, holdfast.ErrNotHeld) {
			// The library cannot tell our own release, applied with its
			// answer lost and then retried, from an outsider's removal:
			// neither can we, so both are said.
			fmt.Fprintf(r.e.stderr, "holdfast: %s: release: %s was not held any more when its release was answered: our release may have applied with its answer lost (it is retried then), or it was removed or taken over from outside (%s)\n", name, r.what, detail(err, holdfast.ErrNotHeld, name))
		} else {
			fmt.Fprintf(r.e.stderr, "holdfast: %s: release: %v\n", name, err)
		}
		s.unanswered = true // the close waits no longer than after a loss
		return
	}
	r.verbosef("%s: released %s, %s", name, r.what, tokens(g))
}
