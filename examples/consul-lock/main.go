// Command consul-lock shares one Consul lock between holdfast and a plain
// api.Lock, and shows what holdfast adds: fencing tokens and guarded writes.
//
// holdfast's Mutex on a name holds the key consul.LockKey(name), "<name>/.lock",
// with api.Lock's flags, so an api.Lock on that key (or `consul lock <name>
// cmd`) and holdfast exclude each other. The program walks through:
// holdfast locks (token T1); api.Lock, trying once, fails; holdfast unlocks
// and api.Lock gets the lock; holdfast waits, and gets it back when api.Lock
// unlocks, with a token T2 > T1; a guarded write (Grant.Txn) succeeds, and
// after Unlock the same write is refused with holdfast.ErrNotHeld.
//
//	go run ./examples/consul-lock                   # starts a Consul dev agent
//	go run ./examples/consul-lock -addr 127.0.0.1:8500
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
)

const (
	name    = "examples/consul-lock"
	dataKey = "examples/consul-lock-data" // what the lock protects
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "consul-lock:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, stdout io.Writer, args []string) error {
	fs := flag.NewFlagSet("consul-lock", flag.ContinueOnError)
	addr := fs.String("addr", "", "Consul HTTP address (default: start a dev agent)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	say := func(format string, a ...any) { fmt.Fprintf(stdout, format+"\n", a...) }
	if *addr == "" {
		say("no -addr: starting `consul agent -dev` with embedtest.StartConsul (scripts/consul.sh builds the binary the first time: minutes)")
		agent, err := embedtest.StartConsul()
		if err != nil {
			return err
		}
		defer agent.Close()
		*addr = agent.HTTPAddr
		say("Consul dev agent at %s", *addr)
	}
	client, err := api.NewClient(&api.Config{Address: *addr})
	if err != nil {
		return err
	}

	// Lock-delay 0: if this session died, the lock would be free at once
	// (Consul's default, 15 s, would keep it from everyone that long).
	s, err := consul.NewSession(ctx, client, consul.WithLockDelay(0))
	if err != nil {
		return err
	}
	defer s.Close() // releases whatever the session still holds
	m, err := consul.NewMutex(s, name)
	if err != nil {
		return err
	}
	g1, err := m.Lock(ctx)
	if err != nil {
		return err
	}
	say("holdfast: locked %s (token T1 = %d)", g1.Key(), g1.Token())

	// A plain api.Lock on the same key, trying once for at most 300 ms.
	try, err := client.LockOpts(&api.LockOptions{Key: consul.LockKey(name), LockTryOnce: true, LockWaitTime: 300 * time.Millisecond})
	if err != nil {
		return err
	}
	if lost, err := try.Lock(ctx.Done()); err != nil || lost != nil {
		return fmt.Errorf("api.Lock try-once while holdfast holds the lock: got it %v, error %v", lost != nil, err)
	}
	say("api.Lock: try-once failed: holdfast holds the lock")

	if err := g1.Unlock(ctx); err != nil {
		return err
	}
	say("holdfast: unlocked")
	plain, err := client.LockOpts(&api.LockOptions{Key: consul.LockKey(name)})
	if err != nil {
		return err
	}
	if lost, err := plain.Lock(ctx.Done()); err != nil || lost == nil {
		return fmt.Errorf("api.Lock: %v", errors.Join(err, ctx.Err()))
	}
	say("api.Lock: locked")

	// holdfast waits its turn now, and gets the lock when api.Lock unlocks.
	type result struct {
		g   *consul.Grant
		err error
	}
	got := make(chan result, 1)
	go func() { g, err := m.Lock(ctx); got <- result{g, err} }()
	select {
	case r := <-got:
		return fmt.Errorf("holdfast did not wait while api.Lock held the lock: %v", r.err)
	case <-time.After(300 * time.Millisecond):
	}
	say("holdfast: still waiting after 300 ms: api.Lock holds the lock")
	if err := plain.Unlock(); err != nil {
		return err
	}
	say("api.Lock: unlocked")
	r := <-got
	if r.err != nil {
		return r.err
	}
	g2 := r.g
	say("holdfast: locked again (token T2 = %d; T2 > T1: %v)", g2.Token(), g2.Token() > g1.Token())

	// A guarded write: Consul applies it only while this grant holds the lock.
	set := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: dataKey, Value: fmt.Appendf(nil, "written under token %d", g2.Token())}}}
	if _, err := g2.Txn(ctx, set); err != nil {
		return err
	}
	say("holdfast: guarded write while holding the lock: ok")
	if err := g2.Unlock(ctx); err != nil {
		return err
	}
	say("holdfast: unlocked")
	_, err = g2.Txn(ctx, set)
	if !errors.Is(err, holdfast.ErrNotHeld) {
		return fmt.Errorf("guarded write after Unlock: %v, want ErrNotHeld", err)
	}
	say("holdfast: guarded write after Unlock refused: %v", err)
	return nil
}
