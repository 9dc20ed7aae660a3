package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	hfetcd "github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/semaphore"
)

// semaphoreDemo shapes the demo's second act.
type semaphoreDemo struct {
	Processes int           // semaphore.Groups, as separate processes would run
	Sessions  int           // lockers (sessions) per Group: its local parallelism
	Jobs      int           // jobs per Group
	Limit     int           // the store's limit
	Work      time.Duration // how long a job runs
}

var defaultSemaphoreDemo = semaphoreDemo{Processes: 3, Sessions: 2, Jobs: 4, Limit: 2, Work: 120 * time.Millisecond}

// semaphoreActResult is the second act's summary.
type semaphoreActResult struct {
	Jobs    int // jobs that ran to the end
	MaxLive int // most jobs running at once, across the processes
	Over    int // job starts that made more than Limit run at once
	MaxKeys int // most contender keys seen under the semaphore's name
}

func (r semaphoreActResult) ok(d semaphoreDemo) bool {
	return r.Over == 0 && r.Jobs == d.Processes*d.Jobs && r.MaxKeys <= d.Processes*d.Sessions
}

// semaphoreAct is the demo's second act: several processes' worth of
// semaphore.Groups run jobs under one etcd semaphore, and the store keeps
// them to its limit. It prints its timeline to out.
func semaphoreAct(ctx context.Context, out io.Writer, cluster *etcdtest.Cluster, d semaphoreDemo) (res semaphoreActResult, err error) {
	const name = "holdfast-demo/encoders"
	fmt.Fprintln(out)
	fmt.Fprintf(out, "Act 2: a semaphore bounds work across processes. %d processes, each a semaphore.Group over %d sessions,\n", d.Processes, d.Sessions)
	fmt.Fprintf(out, "run %d jobs of %v each; the store (etcd Semaphore %q, limit %d) lets at most %d run at once, whoever's they are.\n", d.Jobs, d.Work, name, d.Limit, d.Limit)
	fmt.Fprintln(out, "Each process waits for permits with at most one key per session in etcd, however many jobs it has queued.")
	fmt.Fprintln(out)

	newClient := func() (*clientv3.Client, error) {
		return cluster.NewClient(func(c *clientv3.Config) { c.Logger = zap.NewNop() })
	}
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	groups := make([]*semaphore.Group, d.Processes)
	for p := range groups {
		lockers := make([]holdfast.Locker, d.Sessions)
		for i := range lockers {
			cli, err := newClient()
			if err != nil {
				return res, err
			}
			closers = append(closers, func() { cli.Close() })
			s, err := hfetcd.NewSession(ctx, cli, hfetcd.WithTTL(hfetcd.MinTTL))
			if err != nil {
				return res, err
			}
			closers = append(closers, func() { s.Close() })
			sem, err := hfetcd.NewSemaphore(s, name, d.Limit)
			if err != nil {
				return res, err
			}
			lockers[i] = holdfast.AsLocker[*hfetcd.Grant](sem)
		}
		if groups[p], err = semaphore.NewGroup(ctx, lockers...); err != nil {
			return res, err
		}
	}
	observer, err := newClient()
	if err != nil {
		return res, err
	}
	defer observer.Close()

	tl := &timeline{w: out, start: time.Now()}
	var (
		live, jobs, over atomic.Int32
		mu               sync.Mutex
		maxLive, maxKeys int
	)
	watchCtx, stopWatch := context.WithCancel(ctx)
	keysDone := make(chan struct{})
	go func() { // count the contender keys in etcd while the jobs run
		defer close(keysDone)
		for watchCtx.Err() == nil {
			if r, err := observer.Get(watchCtx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err == nil {
				mu.Lock()
				maxKeys = max(maxKeys, int(r.Count))
				mu.Unlock()
			}
			sleepCtx(watchCtx, 5*time.Millisecond)
		}
	}()

	var wg sync.WaitGroup
	errs := make([]error, d.Processes)
	for p, g := range groups {
		proc := fmt.Sprintf("process-%d", p+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range d.Jobs {
				g.Go(func(ctx context.Context) error {
					n := int(live.Add(1))
					mu.Lock()
					maxLive = max(maxLive, n)
					mu.Unlock()
					if n > d.Limit {
						over.Add(1)
					}
					tl.log(proc, "job %d starts (permit token %d); %d running", j+1, semaphore.Permit(ctx).Token(), n)
					defer live.Add(-1)
					select {
					case <-time.After(d.Work):
						jobs.Add(1)
						return nil
					case <-ctx.Done():
						return context.Cause(ctx)
					}
				})
			}
			errs[p] = g.Wait()
		}()
	}
	wg.Wait()
	stopWatch()
	<-keysDone
	for p, err := range errs {
		if err != nil {
			return res, fmt.Errorf("process-%d: %w", p+1, err)
		}
	}
	res = semaphoreActResult{Jobs: int(jobs.Load()), MaxLive: maxLive, Over: int(over.Load()), MaxKeys: maxKeys}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "semaphore: %d jobs done, at most %d running at once (limit %d), %d over the limit; at most %d keys in etcd (%d sessions)\n",
		res.Jobs, res.MaxLive, d.Limit, res.Over, res.MaxKeys, d.Processes*d.Sessions)
	return res, nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// runSemaphoreAct runs the second act with its defaults and reports a
// failed check as an error.
func runSemaphoreAct(ctx context.Context, out io.Writer, cluster *etcdtest.Cluster) error {
	d := defaultSemaphoreDemo
	res, err := semaphoreAct(ctx, out, cluster, d)
	if err != nil {
		return fmt.Errorf("demo act 2 (semaphore): %w", err)
	}
	if !res.ok(d) {
		return fmt.Errorf("demo act 2 (semaphore) failed: jobs=%d over_limit=%d max_keys=%d", res.Jobs, res.Over, res.MaxKeys)
	}
	return nil
}
