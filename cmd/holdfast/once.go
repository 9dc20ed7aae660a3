package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
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
first claim; if the period is already claimed, a later one was, or an
earlier period's run still holds, it exits --claimed-exit (default 0)
without running CMD. Run it from cron (or a systemd timer) on every replica
at each tick: one replica runs CMD per period. --every is at least 1s: the
claim must be answered before its period ends.

The store records the last period claimed under NAME (the key NAME/.claim,
about 30 bytes, which stays: the one key left behind), so a period runs once
whatever the delays: a replica whose clock, cron or store is late is
refused, and a claim answered after its period ended does not run CMD. No
--at-least is needed for that: it defaults to 0. --at-least D keeps the run
marked D after the claim even if CMD ends sooner (holdfast waits, then
removes the mark), so that a replica whose clock or cron runs early cannot
start the next period's run sooner than D after this one.

A run is marked in the store (NAME/.run, with an etcd lease or a Consul
session of its own) until CMD ends, or --at-most (default --every, at least
the store's floor: etcd 2s, Consul 20s; at most 48h on Consul) if holdfast
dies: later periods are skipped while it holds. CMD must finish within
--at-most (on Consul, within half of it: Consul may expire a session from
its TTL, AtMost/2, on); CMD is dead by the claim's deadline: it is sent
SIGTERM --kill-grace before it (at most a fifth of the claim's time) and
SIGKILL just before it, and holdfast exits 122. holdfast exits leaving no lease or
session behind, CMD run or not, unless the store stopped answering before holdfast could destroy it:
then it expires after its TTL.

The attempt, connecting included, is bounded by the end of the period (a
claim cannot run after it), or by --timeout if shorter; --try bounds it by
2s. A store that does not answer in time exits 125.

CMD gets the environment of "holdfast lock": HOLDFAST_NAME, HOLDFAST_KEY
(NAME/.run), HOLDFAST_TOKEN (the claim's fencing token, increasing from
period to period), and HOLDFAST_PERIOD (the period's start, RFC 3339, UTC).
Signals are handled as by "holdfast lock". -v says on stderr what happens,
the skip of a period already claimed included: without -v a skip prints
nothing (cron mails any output, and every replica but one skips).
--metrics-addr and --log work as for "holdfast lock".

Exit status:
  CMD's own       CMD ran and exited (0 with --child-exit-code=false)
  --claimed-exit  the period was already claimed, or was over before the
                  claim was made: CMD did not run (default 0)
  2               bad usage
  122             the claim ended (deadline) while CMD ran; CMD was stopped
  125             holdfast failed: the store unreachable or silent within
                  the bound, refused
  126, 127        CMD could not be started, CMD not found
  128+N           holdfast got signal N while claiming (SIGINT: holdfast
                  dies of it, as after a CMD that died of SIGINT)`,
	flags: onceFlags,
}

// minEvery is the shortest --every: the claim, a store's round trips from
// connecting on, must fit in what is left of the period, and under a
// second the store's answer would often come after the period's end.
const minEvery = time.Second

// The range of --at-most: a store's shortest claim (etcd's shortest lease;
// twice Consul's shortest session TTL) and Consul's longest (twice its
// longest session TTL). The default, --every, is brought into it.
const (
	etcdClaimFloor     = 2 * time.Second
	consulClaimFloor   = 2 * hfconsul.MinTTL
	consulClaimCeiling = 2 * hfconsul.MaxTTL
)

func onceFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	sf := addStoreFlags(fs)
	vis := addVisibilityFlags(fs)
	every := fs.Duration("every", 0, "the length of a period (required, at least 1s)")
	atLeast := fs.Duration("at-least", 0, "keep the run marked this long after the claim even if CMD ends sooner, so that an early clock cannot start the next period's run sooner (0: not needed for once per period)")
	atMost := fs.Duration("at-most", 0, "how long a run stays marked if holdfast dies (default --every, at least 2s on etcd, 20s on Consul, at most 48h on Consul)")
	timeout := fs.Duration("timeout", 0, "give up after this long, connecting included, exiting 125 (0: at the end of the period)")
	try := fs.Bool("try", false, "bound the attempt, connecting included, by --timeout, else "+tryBound.String())
	grace := fs.Duration("kill-grace", 10*time.Second, "when the claim ends, how long CMD has between SIGTERM and SIGKILL")
	childCode := fs.Bool("child-exit-code", true, "exit with CMD's exit status; false: exit 0 whenever CMD ran")
	claimedExit := fs.Int("claimed-exit", 0, "exit status when the period is already claimed and CMD does not run")
	return func(ctx context.Context, e *env, args []string) error {
		name, argv, err := splitCommand(ctx, args)
		if err != nil {
			return err
		}
		sched := holdfast.Schedule{Every: *every, AtLeast: *atLeast, AtMost: *atMost}
		floor, ceiling := etcdClaimFloor, time.Duration(math.MaxInt64)
		if *sf.backend == "consul" {
			floor, ceiling = consulClaimFloor, consulClaimCeiling
		}
		if sched.AtMost == 0 {
			sched.AtMost = min(max(sched.Every, floor), ceiling)
		}
		switch {
		case *atMost < 0:
			return usagef("--at-most %v is negative", *atMost)
		case *atMost > 0 && (*atMost < floor || *atMost > ceiling):
			if ceiling == time.Duration(math.MaxInt64) {
				return usagef("--at-most %v is shorter than %s's shortest claim, %v", *atMost, *sf.backend, floor)
			}
			return usagef("--at-most %v is not between %v and %v on %s (twice its session TTL bounds)", *atMost, floor, ceiling, *sf.backend)
		}
		switch {
		case *every <= 0:
			return usagef("--every is required and must be positive")
		case *every < minEvery:
			return usagef("--every %v is shorter than %v, the shortest period accepted: the claim, connecting included, must be answered before its period ends (holdfast gives up then), which a shorter period leaves no time for", *every, minEvery)
		case *atLeast < 0:
			return usagef("--at-least %v is negative", *atLeast)
		case *atLeast >= *every && *every > 0:
			return usagef("--at-least %v is not shorter than --every %v: the next period would always be skipped", *atLeast, *every)
		case *atLeast > sched.AtMost:
			return usagef("--at-least %v is longer than --at-most %v", *atLeast, sched.AtMost)
		case *timeout < 0:
			return usagef("--timeout %v is negative", *timeout)
		case *grace < 0:
			return usagef("--kill-grace %v is negative", *grace)
		case *claimedExit < 0 || *claimedExit > 255:
			return usagef("--claimed-exit %d: want 0 to 255", *claimedExit)
		}
		if err := sched.Validate(); err != nil {
			return usagef("%v", err)
		}
		if err := holdfast.ValidateName(name); err != nil {
			return explain(err, name, "")
		}
		stop, err := vis.start(e, sf)
		if err != nil {
			return err
		}
		defer stop()
		period := sched.Period(time.Now())
		bound := time.Until(period.Add(sched.Every))
		switch {
		case *timeout > 0:
			bound = min(bound, *timeout)
		case *try:
			bound = min(bound, tryBound)
		}
		r := runner{e: e, what: "the claim", grace: *grace, childCode: *childCode, bound: max(bound, time.Millisecond), try: true, verbose: *vis.verbose, unrenewed: true,
			extraEnv: []string{"HOLDFAST_PERIOD=" + period.Format(time.RFC3339)}}
		err = r.run(ctx, sf, func(ctx context.Context, s *session) (holdfast.Grant, error) {
			g, err := claim(ctx, s, name, sched, period)
			if err != nil || sched.AtLeast == 0 {
				return g, err
			}
			return atLeastGrant{g, time.Now().Add(sched.AtLeast)}, nil
		}, name, argv)
		if errors.Is(err, holdfast.ErrClaimed) {
			d := detail(err, holdfast.ErrClaimed, name)
			if errors.Is(err, holdfast.ErrPeriodOver) {
				d = detail(err, holdfast.ErrPeriodOver, name) + ": the period was over when the claim was answered"
			}
			if *vis.verbose { // a skip is the normal case on all replicas but one: silent, for cron's mail
				fmt.Fprintf(e.stderr, "holdfast: %s: not running the command %s\n", name, d)
			}
			if *claimedExit == 0 {
				return nil
			}
			return exitError{code: *claimedExit}
		}
		return err
	}
}

// atLeastGrant is a claim whose release waits until AtLeast after the claim
// (the library's Unlock waits too, but within the runner's release bound):
// then the release has a bound of its own.
type atLeastGrant struct {
	holdfast.Grant
	until time.Time
}

func (g atLeastGrant) Unlock(ctx context.Context) error {
	t := time.NewTimer(time.Until(g.until))
	defer t.Stop()
	select {
	case <-t.C:
	case <-g.Context().Done():
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	return g.Grant.Unlock(uctx)
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
