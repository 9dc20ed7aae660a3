package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/holdfast/holdfast"
	hfconsul "github.com/holdfast/holdfast/consul"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

var onceCommand = &command{
	name:       "once",
	summary:    "run a command at most once per period across a fleet (cron)",
	ownSignals: true,
	usage: `usage: holdfast once --every D [--at-least D] [--at-most D] [flags] NAME -- CMD [ARGS...]

Claims the period NAME is in now (periods are the multiples of --every since
the Unix epoch, by this machine's wall clock) and runs CMD if this is the
first claim; if the period is already claimed (or an earlier period's run
still holds the claim), it exits --claimed-exit (default 0) without running
CMD. Run it from cron (or a systemd timer) on every replica at each tick:
one replica runs CMD per period.

The claim stays taken --at-least after it was made even if CMD ends sooner,
so a replica whose clock (or cron) is late by less than that finds it taken.
Keep --at-least larger than the clock skew between replicas plus the spread
of their cron start times, and --at-least plus that skew under --every. The
claim lasts --at-most (default --every) if holdfast dies: the store frees it
by then. CMD must finish within --at-most (on Consul, within half of it:
Consul may expire a session from its TTL, AtMost/2, on); when the claim
reaches its deadline CMD is sent SIGTERM, then SIGKILL after --kill-grace,
and holdfast exits 122. Consul: --at-most is at least 20s, and a claim
released early stays until --at-least only while holdfast runs: after it
exits, Consul frees it between the rest of --at-least (at least 10s) and
twice that.

CMD gets the environment of "holdfast lock": HOLDFAST_NAME, HOLDFAST_KEY
(NAME/.claim), HOLDFAST_TOKEN (the claim's fencing token), and
HOLDFAST_PERIOD (the period's start, RFC 3339, UTC). Signals are handled as
by "holdfast lock".

Exit status:
  CMD's own       CMD ran and exited (0 with --child-exit-code=false)
  --claimed-exit  the period was already claimed: CMD did not run (default 0)
  2               bad usage
  122             the claim ended (deadline) while CMD ran; CMD was stopped
  125             holdfast failed (store unreachable, refused)
  126, 127        CMD could not be started, CMD not found
  128+N           holdfast got signal N while claiming`,
	flags: onceFlags,
}

func onceFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	sf := addStoreFlags(fs)
	every := fs.Duration("every", 0, "the length of a period (required)")
	atLeast := fs.Duration("at-least", 0, "how long a claim stays taken after it was made, even if CMD ends sooner")
	atMost := fs.Duration("at-most", 0, "how long a claim lasts if holdfast dies (default --every)")
	grace := fs.Duration("kill-grace", 10*time.Second, "when the claim ends, how long CMD has between SIGTERM and SIGKILL")
	childCode := fs.Bool("child-exit-code", true, "exit with CMD's exit status; false: exit 0 whenever CMD ran")
	claimedExit := fs.Int("claimed-exit", 0, "exit status when the period is already claimed and CMD does not run")
	return func(ctx context.Context, e *env, args []string) error {
		name, argv, err := splitCommand(ctx, args)
		if err != nil {
			return err
		}
		sched := holdfast.Schedule{Every: *every, AtLeast: *atLeast, AtMost: *atMost}
		if sched.AtMost == 0 {
			sched.AtMost = sched.Every
		}
		switch {
		case *every <= 0:
			return usagef("--every is required and must be positive")
		case *grace < 0:
			return usagef("--kill-grace %v is negative", *grace)
		case *claimedExit < 0 || *claimedExit > 255:
			return usagef("--claimed-exit %d: want 0 to 255", *claimedExit)
		}
		if err := sched.Validate(); err != nil {
			return usagef("%v", err)
		}
		if err := holdfast.ValidateName(name); err != nil {
			return usagef("%v", err)
		}
		period := sched.Period(time.Now())
		r := runner{e: e, what: "the claim", grace: *grace, childCode: *childCode,
			extraEnv: []string{"HOLDFAST_PERIOD=" + period.Format(time.RFC3339)}}
		err = r.run(ctx, sf, func(ctx context.Context, s *session) (holdfast.Grant, error) {
			return claim(ctx, s, name, sched, period)
		}, name, argv)
		if errors.Is(err, holdfast.ErrClaimed) {
			fmt.Fprintf(e.stderr, "holdfast: not running the command: %v\n", errors.Unwrap(err))
			if *claimedExit == 0 {
				return nil
			}
			return exitError{code: *claimedExit}
		}
		return err
	}
}

// claim claims period of name through s.
func claim(ctx context.Context, s *session, name string, sched holdfast.Schedule, period time.Time) (holdfast.Grant, error) {
	if s.etcd != nil {
		o, err := hfetcd.NewOnce(s.etcd, name, sched)
		if err != nil {
			return nil, err
		}
		return grantOf(o.ClaimPeriod(ctx, period))
	}
	o, err := hfconsul.NewOnce(s.consul, name, sched)
	if err != nil {
		return nil, err
	}
	return grantOf(o.ClaimPeriod(ctx, period))
}

// grantOf turns a backend's (G, error) into (holdfast.Grant, error) without
// turning a nil pointer into a non-nil interface.
func grantOf[G holdfast.Grant](g G, err error) (holdfast.Grant, error) {
	if err != nil {
		return nil, err
	}
	return g, nil
}
