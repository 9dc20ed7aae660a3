package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/holdfast/holdfast/internal/safety"
)

var soakCommand = &command{
	name:    "soak",
	summary: "run the safety suite under injected faults for as long as asked",
	usage: `usage: holdfast soak [flags]

Runs holdfast's safety scenario on servers it starts itself and prints a
summary. Clients take one lock and write to a fenced resource that refuses
tokens lower than one it has accepted, while faults are injected one at a
time:

  etcd    a 3-member cluster in a temporary directory: members stopped and
          restarted (followers and the leader), the leader cut from its
          peers, clients' connections blackholed or frozen (below and
          beyond the 2 s TTL)
  consul  a dev agent: holders' sessions destroyed from outside, clients'
          connections blackholed or frozen (TTL 10 s, lock-delay 1 s)

The checkers: the fence never accepted a lower token after a higher one;
the history of grants and fenced writes is linearizable against a fenced
mutex (porcupine); no client was granted a token while an older grant was
still live elsewhere (grants ended from outside excepted); no key is left.
The summary counts faults per kind, operations, fenced writes accepted and
rejected, violations per checker, and the worst fault-to-notice and
takeover times. Exits 1 if any checker failed. See docs/SAFETY.md.`,
	flags: soakFlags,
}

func soakFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	backend := fs.String("backend", "etcd", "store: etcd or consul")
	duration := fs.Duration("duration", time.Minute, "how long the scenario runs")
	clients := fs.Int("clients", 4, "how many clients contend")
	verbose := fs.Bool("v", false, "print each fault as it is injected")
	return func(ctx context.Context, e *env, args []string) error {
		switch {
		case len(args) > 0:
			return usagef("soak takes no arguments")
		case *duration <= 0:
			return usagef("--duration must be positive")
		case *clients < 2:
			return usagef("--clients must be at least 2")
		}
		var log = e.stderr
		if !*verbose {
			log = nil
		}
		var s safety.Summary
		var err error
		switch *backend {
		case "etcd":
			s, err = safety.RunEtcd(ctx, safety.EtcdOptions{Duration: *duration, Clients: *clients, Log: log})
		case "consul":
			s, err = safety.RunConsul(ctx, safety.ConsulOptions{Duration: *duration, Clients: *clients, Log: log})
		default:
			return usagef("--backend %q: want etcd or consul", *backend)
		}
		fmt.Fprintln(e.stdout, s)
		if err != nil {
			return err
		}
		if !s.OK() {
			for _, v := range append(s.FenceViolations, s.ToldFirstViolations...) {
				fmt.Fprintln(e.stdout, "violation:", v)
			}
			return errors.New("a checker failed")
		}
		return nil
	}
}
