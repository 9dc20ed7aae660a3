package main

import (
	"context"

	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/holdfast/holdfast/cmd/holdfast/internal/safety"
)

var soakCommand = &command{
	name:    "soak",
	summary: "run the safety suite under injected faults for as long as asked",
	usage: `usage: holdfast soak [flags]

Runs holdfast's safety scenario on servers it starts itself and prints a
summary. Clients take one lock (or a permit of a semaphore of limit 2, or
leadership of an election) and write to a fenced resource that refuses
tokens lower than one it has accepted, while faults are injected one at a
time. A fifth of the grants are held past the TTL (4 s on etcd, 12 s on
Consul), so that faults find holders.

  etcd    a 3-member cluster in a temporary directory: members stopped and
          restarted (followers and the leader), the leader cut from its
          peers, clients' connections blackholed or frozen (below and
          beyond the 2 s TTL), a waiting contender's key deleted
  consul  a 3-server cluster: servers killed and restarted (the leader and
          followers), servers frozen with SIGSTOP for 2 to 8 s and resumed
          (the leader and followers), holders' sessions destroyed from
          outside, clients' connections blackholed or frozen (TTL 10 s,
          lock-delay 1 s)

--faults picks the kinds of fault (comma-separated names from the list
above, as -v prints them); --faults none runs without faults, the baseline
for grants per minute under faults.

--primitive all runs the mutex, the semaphore and the election in turn,
each for --duration, on a fresh cluster each, and prints each summary.
--primitive multi has the clients take a two-name lock (NAME and a second
name, passed in a random order each time) as one grant; the checkers watch
NAME.
--primitive shard has the clients be the members of a group of 8 shards
(package shard): each shard's work writes to its own fenced resource while
it owns the shard, and each shard gets every checker below (for a shard, a
client waits while any member runs). Its faults: the store's (etcd:
stop-follower, stop-leader, cut-leader-peers; Consul: kill-leader,
kill-follower, freeze-leader, freeze-follower), and members killed
(kill-member: their connection cut and their work stopped at once, as
kill -9 does; restarted at once with a new session), paused (pause-member:
their connection frozen) and restarted (restart-member: a graceful leave,
then a join).

The checkers: the fence never accepted a lower token after a higher one;
the history of grants and fenced writes is linearizable against a fenced
mutex (porcupine); no client was granted a token while an older grant was
still live elsewhere (grants ended from outside excepted; for the semaphore,
no more than 2 live grants); no key is left; the lock was never free
while a client waited in Lock for more than 1 s, or, near a fault that
can end a session, the fault + the store's expiry of a session (etcd: TTL;
Consul: 2 x TTL) + lock-delay + 1 s (liveness). The summary counts faults per
kind, operations, fenced writes accepted and rejected, violations per
checker, how many grants a fault ended, and for those the worst time from
the fault to the holder's grant context being done (fault-to-notice) and to
the next grant (takeover). Exits 1 if any checker failed. See
docs/SAFETY.md.`,
	flags: soakFlags,
}

func soakFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	backend := fs.String("backend", "etcd", "store: etcd or consul")
	primitive := fs.String("primitive", "mutex", "what the clients take: mutex, semaphore, election, multi (a two-name lock), shard (members of a group of 8 shards), or all (mutex, semaphore, election in turn)")
	duration := fs.Duration("duration", time.Minute, "how long the scenario runs (each, with --primitive all)")
	clients := fs.Int("clients", 4, "how many clients contend")
	verbose := fs.Bool("v", false, "print each fault as it is injected")
	faultList := fs.String("faults", "", "comma-separated kinds of fault to inject (default: every kind of the store's scenario); \"none\": a run without faults, the baseline for grants per minute")
	return func(ctx context.Context, e *env, args []string) error {
		switch {
		case len(args) > 0:
			return usagef("soak takes no arguments")
		case *duration <= 0:
			return usagef("--duration must be positive")
		case *clients < 2:
			return usagef("--clients must be at least 2")
		case *backend != "etcd" && *backend != "consul":
			return usagef("--backend %q: want etcd or consul", *backend)
		}
		prims, err := soakPrimitives(*primitive)
		if err != nil {
			return err
		}
		var kinds []string
		if *faultList != "" {
			kinds = strings.Split(*faultList, ",")
			known := safety.EtcdFaults
			switch {
			case *backend == "consul" && *primitive == string(safety.Shard):
				known = safety.ConsulShardFaults
			case *backend == "consul":
				known = safety.ConsulFaults
			case *primitive == string(safety.Shard):
				known = safety.EtcdShardFaults
			}
			for _, k := range kinds {
				if k != safety.NoFaults && !slices.Contains(known, k) || k == safety.NoFaults && len(kinds) > 1 {
					return usagef("--faults %q: want none, or some of %s", *faultList, strings.Join(known, ","))
				}
			}
		}
		var log io.Writer
		if *verbose {
			log = e.stderr
		}
		failed := 0
		for i, p := range prims {
			if i > 0 {
				fmt.Fprintln(e.stdout)
			}
			var s safety.Summary
			var err error
			if *backend == "etcd" {
				s, err = safety.RunEtcd(ctx, safety.EtcdOptions{Duration: *duration, Clients: *clients, Primitive: p, Log: log, Faults: kinds})
			} else {
				s, err = safety.RunConsul(ctx, safety.ConsulOptions{Duration: *duration, Clients: *clients, Primitive: p, Log: log, Faults: kinds})
			}
			fmt.Fprintln(e.stdout, s)
			if err != nil {
				return fmt.Errorf("soak %s: %w", p, err)
			}
			if !s.OK() {
				failed++
				for _, v := range s.FenceViolations {
					fmt.Fprintln(e.stdout, "violation: fence:", v)
				}
				for _, v := range s.ToldFirstViolations {
					fmt.Fprintln(e.stdout, "violation: told first:", v)
				}
				for _, v := range s.Witnesses {
					fmt.Fprintln(e.stdout, "violation: not linearizable:", v)
				}
				for _, v := range s.Liveness.Violations {
					fmt.Fprintln(e.stdout, "violation: liveness:", v)
				}
				for _, k := range s.LeftKeys {
					fmt.Fprintln(e.stdout, "violation: key left:", k)
				}
				if s.Grants == 0 {
					fmt.Fprintln(e.stdout, "failed: no grant in the whole run")
				}
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		if failed > 0 {
			return fmt.Errorf("a checker failed (%d of %d runs)", failed, len(prims))
		}
		return nil
	}
}

// soakPrimitives parses --primitive.
func soakPrimitives(s string) ([]safety.Primitive, error) {
	if s == "all" {
		return safety.Primitives, nil
	}
	for _, p := range append(safety.Primitives, safety.Multi, safety.Shard) {
		if string(p) == s {
			return []safety.Primitive{p}, nil
		}
	}
	return nil, usagef("--primitive %q: want mutex, semaphore, election, multi, shard or all", s)
}
