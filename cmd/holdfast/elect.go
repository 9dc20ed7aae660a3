package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os/signal"
	"time"

	"github.com/holdfast/holdfast"
)

var electCommand = &command{
	name:       "elect",
	summary:    "run a command while leader of an election, or watch an election",
	ownSignals: true,
	usage: `usage: holdfast elect [flags] NAME [flags] --value V -- CMD [ARGS...]
       holdfast elect --observe [--json] NAME

Campaigns in the election NAME with the proposal V and, once leader, runs CMD.
If leadership is lost while CMD runs (session expired or revoked, key
deleted), CMD is stopped as by "holdfast lock" (SIGTERM, then SIGKILL after
--kill-grace) and holdfast exits 122, or with --loop campaigns again and
runs CMD anew once it wins. When CMD exits, holdfast resigns and exits with
CMD's status. Signals and the other exit statuses are those of "holdfast
lock" (see "holdfast help lock").

The key layout is the native one: on etcd that of concurrency.Election and
"etcdctl elect NAME"; on Consul the lock key NAME/.lock of api.Lock and
"consul lock NAME", with the proposal as its value. Native candidates
campaign in the same election and see the same leader.

CMD gets HOLDFAST_NAME, HOLDFAST_KEY, HOLDFAST_TOKEN (the leader's term, its
fencing token) and HOLDFAST_VALUE (the proposal).

With --observe, holdfast campaigns for nothing: it prints the current leader
(or "no leader") and then every change, one line each (--json: one JSON
object), until interrupted.`,
	flags: electFlags,
}

func electFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	sf := addStoreFlags(fs)
	vis := addVisibilityFlags(fs)
	value := fs.String("value", "", "the proposal published while leader (required to campaign)")
	loop := fs.Bool("loop", false, "after losing leadership, campaign again")
	grace := fs.Duration("kill-grace", 10*time.Second, "when leadership is lost, how long CMD has between SIGTERM and SIGKILL")
	childCode := fs.Bool("child-exit-code", true, "exit with CMD's exit status; false: exit 0 whenever CMD ran")
	observe := fs.Bool("observe", false, "print each leader change instead of campaigning")
	jsonOut := fs.Bool("json", false, "with --observe: one JSON object per change")
	return func(ctx context.Context, e *env, args []string) error {
		if *observe {
			for _, f := range []string{"value", "loop", "kill-grace", "child-exit-code"} {
				if flagGiven(ctx, f) {
					return usagef("--observe watches the election: --%s applies to campaigning only", f)
				}
			}
			if len(args) != 1 {
				return usagef("--observe takes exactly one NAME (and no command)")
			}
			if err := holdfast.ValidateName(args[0]); err != nil {
				return explain(err, args[0], "")
			}
			stop, err := vis.start(e, sf)
			if err != nil {
				return err
			}
			defer stop()
			return observeElection(ctx, e, sf, args[0], *jsonOut)
		}
		name, argv, err := splitCommand(ctx, args)
		if err != nil {
			return err
		}
		switch {
		case *jsonOut:
			return usagef("--json applies to --observe only")
		case *value == "":
			return usagef("--value is required to campaign")
		case *grace < 0:
			return usagef("--kill-grace %v is negative", *grace)
		}
		if err := holdfast.ValidateName(name); err != nil {
			return explain(err, name, "")
		}
		stop, err := vis.start(e, sf)
		if err != nil {
			return err
		}
		defer stop()
		r := runner{verbose: *vis.verbose, e: e, what: "leadership", grace: *grace, childCode: *childCode, loop: *loop, extraEnv: []string{"HOLDFAST_VALUE=" + *value}}
		return r.run(ctx, sf, func(ctx context.Context, s *session) (holdfast.Grant, error) {
			c, err := s.election(name)
			if err != nil {
				return nil, err
			}
			return c.Campaign(ctx, []byte(*value))
		}, name, argv)
	}
}

// observation is one line of elect --observe --json.
type observation struct {
	Time  time.Time `json:"time"`
	None  bool      `json:"none,omitempty"`
	Key   string    `json:"key,omitempty"`
	Value string    `json:"value,omitempty"`
	Term  uint64    `json:"term,omitempty"`
}

// observeElection prints every leader change of name until interrupted.
func observeElection(ctx context.Context, e *env, sf *storeFlags, name string, jsonOut bool) error {
	ctx, stop := signal.NotifyContext(ctx, stopSignals...)
	defer stop()
	s, err := sf.open(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return explain(err, name, sf.describe())
	}
	defer s.Close()
	c, err := s.election(name)
	if err != nil {
		return explain(err, name, sf.describe())
	}
	enc := json.NewEncoder(e.stdout)
	for l := range c.Observe(ctx) {
		o := observation{Time: time.Now().UTC(), None: l.None(), Key: l.Key, Value: string(l.Value), Term: uint64(l.Term)}
		switch {
		case jsonOut:
			if err := enc.Encode(o); err != nil {
				return err
			}
		case l.None():
			fmt.Fprintf(e.stdout, "%s  no leader\n", o.Time.Format(time.RFC3339Nano))
		default:
			fmt.Fprintf(e.stdout, "%s  leader term=%d value=%q key=%s\n", o.Time.Format(time.RFC3339Nano), o.Term, o.Value, o.Key)
		}
	}
	if ctx.Err() != nil {
		return nil // interrupted
	}
	if err := s.Err(); err != nil {
		return exitError{exitFailed, fmt.Errorf("%s: observing stopped: %w", name, err)}
	}
	return nil
}
