// Command etcd-cron runs a cron job at most once per tick, however many
// workers are scheduled to run it.
//
// Three workers (goroutines here, each with its own etcd client and session,
// as separate processes would have) wake up on the same schedule and each
// tries to take the lock /cron/report with TryLock. The winner runs the job;
// the others skip the tick. The winner records its run with a guarded write,
// Grant.Txn, which commits only while the lock is still held, so a worker
// that lost the lock during the job (a long GC pause, a partition) cannot
// record over a newer run. Each run's fencing token is higher than the last.
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
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/etcd"
)

const (
	lockName = "cron/report"
	// The job's record. Not under lockName+"/": every key there counts as a
	// holder or a waiter of the lock.
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
	fs.BoolVar(&c.verbose, "v", false, "also print the workers that skip a tick")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.ticks < 0 || c.every <= 0 || c.job < 0 || c.jitter < 0 {
		return errors.New("-ticks, -every, -job and -jitter must not be negative, -every not zero")
	}
	eps := strings.Split(*endpoints, ",")
	if *endpoints == "" {
		cluster, err := embedtest.StartEtcd("", 1) // in a temporary directory, removed by Close
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
	m, err := etcd.NewMutex(s, lockName)
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
		skipped, err := c.runJob(ctx, m, cli, name, tick, at)
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

// runJob runs the job of the tick due at `at` if it gets the lock and nobody
// has run that tick yet. It returns why it skipped, or "" if it ran.
func (c *cron) runJob(ctx context.Context, m *etcd.Mutex, cli *clientv3.Client, name string, tick int, at time.Time) (string, error) {
	g, err := m.TryLock(ctx)
	if errors.Is(err, holdfast.ErrLocked) {
		return "lock taken", nil
	} else if err != nil {
		return "", err
	}
	defer g.Unlock(context.WithoutCancel(ctx)) // ErrNotHeld if the lock was lost: nothing to undo

	// A worker running late can get the lock after this tick's run is over:
	// check the record (only a holder writes it, so it cannot change now).
	resp, err := cli.Get(ctx, lastRunKey)
	if err != nil {
		return "", err
	}
	var last int64 // when the last run was due, in Unix ns
	if len(resp.Kvs) > 0 {
		fmt.Sscanf(string(resp.Kvs[0].Value), "at=%d", &last)
	}
	if last >= at.UnixNano() {
		return "already ran", nil
	}

	select { // the job, under the grant's context: cancelled if the lock is lost
	case <-time.After(c.job):
	case <-g.Context().Done():
		return "lock lost during the job", nil
	}
	record := fmt.Sprintf("at=%d tick=%d worker=%s token=%d", at.UnixNano(), tick, name, g.Token())
	if _, err := g.Txn(ctx, clientv3.OpPut(lastRunKey, record)); errors.Is(err, holdfast.ErrNotHeld) {
		return "lock lost before the record was written", nil
	} else if err != nil {
		return "", err
	}
	c.out.Printf("tick %d: %s ran the job (token %d)", tick, name, g.Token()) // still held: lines come in run order
	return "", nil
}
