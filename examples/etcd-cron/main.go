// Command etcd-cron runs a cron job at most once per tick, however many
// workers are scheduled to run it.
//
// Three workers (goroutines here, each with its own etcd client and session,
// as separate processes would have) wake up on the same schedule, each up to
// -jitter late, and each claims the tick with a once-per-period claim
// (etcd.Once). The first claimant runs the job; the others are told at once
// that the tick is claimed and skip it. etcd records the last tick claimed,
// so a worker that wakes up late cannot run the same tick again; the run
// stays marked -at-least (default half a tick) after the claim, so that a
// worker that wakes up early cannot start the next tick's run sooner. The winner records its run with a guarded write, Claim.Txn, which
// commits only while the claim is still held, so a worker whose claim ended
// during the job cannot record over a newer run. Each run's fencing token is
// higher than the last.
//
//	go run ./examples/etcd-cron                  # starts an embedded etcd
//	go run ./examples/etcd-cron -endpoints 127.0.0.1:2379 -ticks 20 -v
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

const (
	claimName = "cron/report"
	// The job's record (a guarded write may not touch the claim's key).
	lastRunKey = "cron/last-run/report"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "etcd-cron:", err)
		os.Exit(1)
	}
}

// cron is what the workers share.
type cron struct {
	first       time.Time // when the first tick is
	every, job  time.Duration
	jitter      time.Duration // how late a worker may wake up
	atLeast     time.Duration // how long a claim stays taken
	ticks       int
	verbose     bool
	out         *log.Logger // safe for concurrent use
	runs, skips atomic.Int64
}

func run(ctx context.Context, stdout io.Writer, args []string) error {
	c := &cron{out: log.New(stdout, "", 0)}
	fs := flag.NewFlagSet("etcd-cron", flag.ContinueOnError)
	endpoints := fs.String("endpoints", "", "etcd endpoints, comma-separated (default: start an embedded etcd)")
	fs.IntVar(&c.ticks, "ticks", 10, "number of ticks")
	fs.DurationVar(&c.every, "every", 100*time.Millisecond, "time between ticks")
	fs.DurationVar(&c.job, "job", 20*time.Millisecond, "how long the job takes")
	fs.DurationVar(&c.jitter, "jitter", 30*time.Millisecond, "workers wake up to this late (clock skew, load)")
	fs.DurationVar(&c.atLeast, "at-least", 0, "how long a claim stays taken (default -every/2); keep -jitter < it and it + -jitter < -every")
	fs.BoolVar(&c.verbose, "v", false, "also print the workers that skip a tick")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.atLeast == 0 {
		c.atLeast = c.every / 2
	}
	if c.ticks < 0 || c.every <= 0 || c.job < 0 || c.jitter < 0 || c.atLeast < 0 {
		return errors.New("-ticks, -every, -job, -jitter and -at-least must not be negative, -every not zero")
	}
	if c.jitter >= c.atLeast || c.atLeast+c.jitter >= c.every {
		return fmt.Errorf("-jitter %v must be under -at-least %v, and -at-least + -jitter under -every %v", c.jitter, c.atLeast, c.every)
	}
	eps := strings.Split(*endpoints, ",")
	if *endpoints == "" {
		cluster, err := etcdtest.StartEtcd("", 1) // in a temporary directory, removed by Close
		if err != nil {
			return err
		}
		defer cluster.Close()
		eps = cluster.Endpoints()
		c.out.Printf("no -endpoints: started an embedded etcd at %s (temporary directory)", eps[0])
	}

	// Ticks fall on multiples of -every on the wall clock, as they would for
	// separate processes; a tick is known by its time.
	c.first = time.Now().Truncate(c.every).Add(2 * c.every)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = c.worker(ctx, fmt.Sprintf("worker-%d", i+1), eps) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.out.Printf("runs=%d skipped=%d", c.runs.Load(), c.skips.Load())
	return nil
}

func (c *cron) worker(ctx context.Context, name string, endpoints []string) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second) // an unreachable etcd: fail, don't hang
	defer cancel()
	s, err := etcd.NewSession(sctx, cli) // one lease, kept alive in the background until Close
	if err != nil {
		return err
	}
	defer s.Close()
	// AtMost: a claim whose worker died frees itself after 2 s (etcd's
	// shortest lease), or after the job's time if longer.
	o, err := etcd.NewOnce(s, claimName, holdfast.Schedule{Every: c.every, AtLeast: c.atLeast, AtMost: max(2*time.Second, 2*c.job)})
	if err != nil {
		return err
	}
	for tick := 1; tick <= c.ticks; tick++ {
		at := c.first.Add(time.Duration(tick-1) * c.every)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(at) + rand.N(c.jitter+1)):
		}
		skipped, err := c.runJob(ctx, o, name, tick, at)
		if err != nil {
			return err
		} else if skipped == "" {
			c.runs.Add(1)
			continue
		}
		c.skips.Add(1)
		if c.verbose {
			c.out.Printf("tick %d: %s skipped (%s)", tick, name, skipped)
		}
	}
	return nil
}

// runJob runs the job of the tick due at `at` if it is the first to claim
// the tick. It returns why it skipped, or "" if it ran.
func (c *cron) runJob(ctx context.Context, o *etcd.Once, name string, tick int, at time.Time) (string, error) {
	cl, err := o.ClaimPeriod(ctx, at)
	if errors.Is(err, holdfast.ErrClaimed) {
		return "claimed", nil
	} else if err != nil {
		return "", err
	}
	// The run is over (Unlock waits until -at-least has passed).
	defer cl.Unlock(context.WithoutCancel(ctx)) // ErrNotHeld if the claim ended: nothing to undo

	select { // the job, under the claim's context: cancelled if the claim ends
	case <-time.After(c.job):
	case <-cl.Context().Done():
		return "claim lost during the job", nil
	}
	record := fmt.Sprintf("at=%d tick=%d worker=%s token=%d", at.UnixNano(), tick, name, cl.Token())
	if _, err := cl.Txn(ctx, clientv3.OpPut(lastRunKey, record)); errors.Is(err, holdfast.ErrNotHeld) {
		return "claim lost before the record was written", nil
	} else if err != nil {
		return "", err
	}
	c.out.Printf("tick %d: %s ran the job (token %d)", tick, name, cl.Token()) // still held: lines come in run order
	return "", nil
}
