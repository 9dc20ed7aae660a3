package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
deleted), or its deadline comes near with no renewal confirmed, CMD is
stopped as by "holdfast lock" (SIGTERM, then SIGKILL after --kill-grace, by
the grant's deadline: see "holdfast help lock") and holdfast exits 122,
or with --loop campaigns again and runs CMD anew once it wins. When CMD
exits, holdfast resigns and exits with CMD's status. Signals are handled as
by "holdfast lock" (see "holdfast help lock"). --timeout D gives up after D,
connecting included (124 if not elected in time); --try campaigns only if
the election has no leader.

The key layout is the native one: on etcd that of concurrency.Election and
"etcdctl elect NAME"; on Consul the lock key NAME/.lock of api.Lock and
"consul lock NAME", with the proposal as its value. Native candidates
campaign in the same election and see the same leader.

CMD gets HOLDFAST_NAME, HOLDFAST_KEY, HOLDFAST_TOKEN (the leader's term, its
fencing token) and HOLDFAST_VALUE (the proposal).

With --observe, holdfast does not campaign and opens no session (no lease,
no Consul session): it reads the election as "holdfast status" does and
prints the current leader (or "no leader"), then every change, one line
each (--json: one JSON object), until interrupted. --timeout bounds
connecting and each read (default ` + statusTimeout.String() + `): a store that does not answer
within it, or refuses the connection, ends --observe with 125; while it
waits for a change, it checks every --timeout that the store still answers:
one that went silent ends it with 125 within twice --timeout.

Exit status:
  CMD's own       CMD ran and exited (128+N if it was killed by signal N);
                  0 with --child-exit-code=false
  0               --observe was interrupted
  2               a usage or input error, found before any request: a bad
                  flag or argument, a missing or invalid NAME, a TTL out of
                  the store's range, a flag of the other store
  122             leadership was lost while CMD ran, or its deadline came
                  near with no renewal confirmed; CMD was stopped
  124             not elected: --timeout elapsed while campaigning, or --try
                  found a leader
  125             holdfast failed once it went to the store: unreachable or
                  silent within --timeout (or --try's bound), refused
                  (permission)
  126, 127        CMD could not be started, CMD not found
  128+N           holdfast got signal N while campaigning (SIGINT: holdfast
                  dies of it, as after a CMD that died of SIGINT)`,
	flags: electFlags,
}

func electFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	sf := addStoreFlags(fs)
	vis := addVisibilityFlags(fs)
	value := fs.String("value", "", "the proposal published while leader (required to campaign)")
	loop := fs.Bool("loop", false, "after losing leadership, campaign again")
	grace := fs.Duration("kill-grace", 10*time.Second, "when leadership is lost, how long CMD has between SIGTERM and SIGKILL")
	childCode := fs.Bool("child-exit-code", true, "exit with CMD's exit status; false: exit 0 whenever CMD ran")
	timeout := fs.Duration("timeout", 0, "give up after this long, connecting included: exiting 124 if not elected in time, 125 if the store did not answer (0: wait as long as it takes)")
	try := fs.Bool("try", false, "campaign only if the election has no leader, else exit 124 at once; the attempt, connecting included, is bounded by --timeout, else "+tryBound.String()+" (124 if another candidate won meanwhile)")
	observe := fs.Bool("observe", false, "print each leader change instead of campaigning")
	jsonOut := fs.Bool("json", false, "with --observe: one JSON object per change")
	return func(ctx context.Context, e *env, args []string) error {
		if *observe {
			for _, f := range []string{"value", "loop", "kill-grace", "child-exit-code", "try", "ttl", "lock-delay", "log", "metrics-addr"} {
				if flagGiven(ctx, f) {
					return usagef("--observe watches the election without a session: --%s applies to campaigning only", f)
				}
			}
			if len(args) != 1 {
				return usagef("--observe takes exactly one NAME (and no command)")
			}
			if err := holdfast.ValidateName(args[0]); err != nil {
				return explain(err, args[0], "")
			}
			bound := statusTimeout
			if flagGiven(ctx, "timeout") {
				if *timeout <= 0 {
					return usagef("--timeout %v: want a positive duration with --observe", *timeout)
				}
				bound = *timeout
			}
			return observeElection(ctx, e, sf, args[0], *jsonOut, bound)
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
		case *timeout < 0:
			return usagef("--timeout %v is negative", *timeout)
		}
		if err := holdfast.ValidateName(name); err != nil {
			return explain(err, name, "")
		}
		stop, err := vis.start(e, sf)
		if err != nil {
			return err
		}
		defer stop()
		// --try is a check for a leader before campaigning, not an atomic
		// try: a campaign that another candidate wins meanwhile waits until
		// the bound, which then counts as a timeout (124), not as a silent
		// store (the runner's try).
		r := runner{verbose: *vis.verbose, e: e, what: "leadership", grace: *grace, childCode: *childCode, loop: *loop, extraEnv: []string{"HOLDFAST_VALUE=" + *value}, bound: *timeout}
		if *try && r.bound == 0 {
			r.bound = tryBound
		}
		return r.run(ctx, sf, func(ctx context.Context, s *session) (holdfast.Grant, error) {
			c, err := s.election(name)
			if err != nil {
				return nil, err
			}
			if *try {
				l, err := c.Leader(ctx)
				switch {
				case err == nil:
					return nil, fmt.Errorf("%w: %s has a leader (term %d)", holdfast.ErrLocked, name, l.Term)
				case !errors.Is(err, holdfast.ErrNoLeader):
					return nil, err
				}
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
// It reads the election's keys with status's reader (no session: an
// observer takes no lease and creates no session), each read bounded by
// timeout, and waits for the next change with a watch (etcd) or a
// blocking query (Consul).
func observeElection(ctx context.Context, e *env, sf *storeFlags, name string, jsonOut bool, timeout time.Duration) error {
	ctx, stop := signal.NotifyContext(ctx, stopSignals...)
	defer stop()
	r, err := sf.reader(ctx, timeout)
	if err != nil {
		return err
	}
	defer r.close()
	enc := json.NewEncoder(e.stdout)
	var last *holdfast.Leader
	for {
		st, err := readBounded(ctx, r, name, timeout)
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted
			}
			return explain(err, name, sf.describe())
		}
		var l holdfast.Leader // none
		if len(st.Holders) > 0 {
			h := st.Holders[0]
			l = holdfast.Leader{Key: h.Key, Value: h.Value, Term: h.Token}
		}
		if last == nil || l.Key != last.Key || l.Term != last.Term || !bytes.Equal(l.Value, last.Value) {
			last = &l
			if err := printLeader(e, enc, l, jsonOut); err != nil {
				return err
			}
		}
		if err := r.wait(ctx, name, st.Index); err != nil {
			if ctx.Err() != nil {
				return nil // interrupted
			}
			return exitError{exitFailed, explainf(err, "%s: observing stopped: %s: %v", name, sf.describe(), err)}
		}
	}
}

// printLeader prints one line of elect --observe.
func printLeader(e *env, enc *json.Encoder, l holdfast.Leader, jsonOut bool) error {
	o := observation{Time: time.Now().UTC(), None: l.None(), Key: l.Key, Value: string(l.Value), Term: uint64(l.Term)}
	switch {
	case jsonOut:
		return enc.Encode(o)
	case l.None():
		fmt.Fprintf(e.stdout, "%s  no leader\n", o.Time.Format(time.RFC3339Nano))
	default:
		fmt.Fprintf(e.stdout, "%s  leader term=%d value=%q key=%s\n", o.Time.Format(time.RFC3339Nano), o.Term, o.Value, o.Key)
	}
	return nil
}
