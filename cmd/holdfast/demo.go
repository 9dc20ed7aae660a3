package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

var demoCommand = &command{
	name:    "demo",
	summary: "show fencing at work: a paused holder's stale write is rejected",
	usage: `usage: holdfast demo

Starts an embedded one-node etcd in a temporary directory (removed at the
end) and plays three acts against it:

Act 1, fencing: 4 workers take one lock (holdfast's etcd Mutex, TTL 2 s)
and write to a fenced resource that rejects tokens lower than the highest it
has seen. One holder is paused beyond its TTL, as in a long GC pause: the
worker stops and its connection to etcd is frozen by a loopback proxy, so its
keepalives stop too. Its grant context is cancelled (it is told it lost the
lock), its lease expires on the server, another worker gets the lock with a
higher token, and when the paused holder wakes and writes anyway with its old
token, the resource rejects it.

Act 2, a semaphore: three processes' semaphore.Groups (2 sessions each)
share one etcd Semaphore of limit 2 and never run more than 2 jobs at once.

Act 3, an election: 3 candidates run leader.Run on one etcd Election (TTL
2 s); the leader writes to a fenced resource, is frozen, is told it lost
leadership before its lease expires, and another candidate takes over with
a higher term; the frozen leader's late write is rejected.

Prints a timeline (ms since the workers started) and a summary line per
act. Exits 0 if no two grants overlapped, the semaphore's limit held and
every stale write was rejected, 1 otherwise. Needs no flags and no server;
takes about 8 seconds (the built binary, measured 7.9 to 8.4 s on a loaded
2-core machine).`,
	flags: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		return func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usagef("demo takes no arguments")
			}
			res, err := runDemo(ctx, e.stdout, defaultDemo)
			if err != nil {
				return err
			}
			if !res.ok() {
				return fmt.Errorf("demo failed: overlaps=%d stale_writes_rejected=%d", res.Overlaps, res.StaleRejected)
			}
			if act, err := runElectionAct(ctx, e.stdout, defaultElectionAct); err != nil || !act.ok(defaultElectionAct) {
				return fmt.Errorf("demo act 3 (election) failed: %v %+v", err, act)
			}
			return nil
		}
	},
}

// demoOptions shape the demo; defaultDemo is what the command runs.
type demoOptions struct {
	Workers int
	TTL     time.Duration
	// Hold is how long a holder works between its write and its Unlock.
	Hold time.Duration
	// PauseGrant: the holder of this grant (1-based) is the one paused.
	PauseGrant int
	// After is how long the others keep working after the stale write.
	After time.Duration
	// Timeout bounds the whole run once etcd is up.
	Timeout time.Duration
}

var defaultDemo = demoOptions{
	Workers:    4,
	TTL:        hfetcd.MinTTL,
	Hold:       150 * time.Millisecond,
	PauseGrant: 5,
	After:      700 * time.Millisecond,
	Timeout:    20 * time.Second,
}

// demoResult is the demo's summary.
type demoResult struct {
	Grants        int // grants handed out
	WritesOK      int // writes the resource accepted
	Overlaps      int // grants handed out while another grant was still live
	StaleRejected int // writes the resource refused for a stale token
	PausedLost    bool
}

func (r demoResult) ok() bool { return r.Overlaps == 0 && r.StaleRejected >= 1 }

// timeline prints events with the milliseconds since start.
type timeline struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func (t *timeline) log(who, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, "%6d ms  %-9s %s\n", time.Since(t.start).Milliseconds(), who, fmt.Sprintf(format, args...))
}

// resource is the fenced resource: an append-only log of writes guarded by
// a holdfast.Fence.
type resource struct {
	fence  holdfast.Fence
	mu     sync.Mutex
	writes []string
}

func (r *resource) write(token holdfast.Token, what string) error {
	return r.fence.Do(token, func() {
		r.mu.Lock()
		r.writes = append(r.writes, what)
		r.mu.Unlock()
	})
}

type demoWorker struct {
	name    string
	proxy   *embedtest.Proxy
	client  *clientv3.Client
	session *hfetcd.Session
	mutex   *hfetcd.Mutex
}

func (w *demoWorker) close() {
	if w.session != nil {
		w.session.Close()
	}
	if w.client != nil {
		w.client.Close()
	}
	if w.proxy != nil {
		w.proxy.Close()
	}
}

// runDemo runs the demo, printing to out, and returns its summary. err is
// for failures of the set-up (etcd, clients); a demo whose checks fail
// returns a result with ok() false.
func runDemo(ctx context.Context, out io.Writer, o demoOptions) (res demoResult, err error) {
	const lockName = "holdfast-demo/lock"
	fmt.Fprintf(out, "holdfast demo: %d workers, one lock %q (holdfast etcd Mutex, session TTL %v), one fenced resource\n\n", o.Workers, lockName, o.TTL)
	fmt.Fprintln(out, "Every grant of the lock carries a fencing token, a number that grows from one grant to the next.")
	fmt.Fprintln(out, "The resource (the fence) remembers the highest token it has seen and refuses writes with a lower one,")
	fmt.Fprintln(out, "so a holder that lost the lock without noticing (here: a paused one) cannot overwrite newer work.")
	fmt.Fprintln(out, "Tokens are etcd revisions: every write to etcd, by anyone, moves them on, so they grow with gaps.")
	fmt.Fprintln(out)

	t0 := time.Now()
	cluster, err := etcdtest.StartEtcd("", 1)
	if err != nil {
		return res, fmt.Errorf("start embedded etcd: %w", err)
	}
	defer cluster.Close()
	ep, err := url.Parse(cluster.Endpoints()[0])
	if err != nil {
		return res, err
	}
	fmt.Fprintf(out, "embedded etcd started at %s in %d ms (temporary directory, removed at exit)\n\n", ep.Host, time.Since(t0).Milliseconds())

	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()

	workers := make([]*demoWorker, o.Workers)
	defer func() {
		var wg sync.WaitGroup
		for _, w := range workers {
			if w != nil {
				wg.Add(1)
				go func() { defer wg.Done(); w.close() }()
			}
		}
		wg.Wait()
	}()
	for i := range workers {
		w := &demoWorker{name: fmt.Sprintf("worker-%d", i+1)}
		workers[i] = w
		// Every worker reaches etcd through its own pausable proxy, with its
		// own client connection and session, as separate processes would.
		if w.proxy, err = embedtest.NewProxy(ep.Host); err != nil {
			return res, err
		}
		w.client, err = clientv3.New(clientv3.Config{
			Endpoints:   []string{"http://" + w.proxy.Addr()},
			DialTimeout: 5 * time.Second,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			return res, err
		}
		if w.session, err = hfetcd.NewSession(ctx, w.client, hfetcd.WithTTL(o.TTL)); err != nil {
			return res, err
		}
		if w.mutex, err = hfetcd.NewMutex(w.session, lockName); err != nil {
			return res, err
		}
	}

	// An observer shows when the server itself deletes the paused holder's
	// key (its lease expired).
	observer, err := cluster.NewClient(func(c *clientv3.Config) { c.Logger = zap.NewNop() })
	if err != nil {
		return res, err
	}
	defer observer.Close()

	tl := &timeline{w: out, start: time.Now()}
	var (
		store         resource
		grants        atomic.Int64
		writesOK      atomic.Int64
		overlaps      atomic.Int64
		stale         atomic.Int64
		live          atomic.Int64 // grants whose holder has not let go and whose context is not cancelled
		pausedKey     atomic.Pointer[string]
		lostAt        atomic.Pointer[time.Time] // when a grant context was cancelled by a loss
		pausedLost    atomic.Bool
		staleDone     = make(chan struct{})
		staleDoneOnce sync.Once
	)
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()

	wch := observer.Watch(clientv3.WithRequireLeader(runCtx), lockName+"/", clientv3.WithPrefix(), clientv3.WithFilterPut())
	var obsWG sync.WaitGroup
	obsWG.Add(1)
	go func() {
		defer obsWG.Done()
		for wr := range wch {
			for _, ev := range wr.Events {
				if k := pausedKey.Load(); k != nil && string(ev.Kv.Key) == *k {
					tl.log("etcd", "lease expired on the server: paused holder's key %s deleted", ev.Kv.Key)
				}
			}
		}
	}()
	defer obsWG.Wait()
	defer stopRun()

	tl.log("", "%d workers start", o.Workers)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				g, err := w.mutex.Lock(runCtx)
				if err != nil {
					if runCtx.Err() == nil {
						tl.log(w.name, "lock failed: %v", err)
					}
					return
				}
				n := grants.Add(1)
				if live.Add(1) > 1 {
					overlaps.Add(1)
					tl.log(w.name, "OVERLAP: granted token %d while another grant is still live", g.Token())
				}
				var letGo sync.Once
				leave := func() { letGo.Do(func() { live.Add(-1) }) }
				tl.log(w.name, "granted token %d", g.Token())
				go func() {
					<-g.Context().Done()
					if cause := context.Cause(g.Context()); !errors.Is(cause, holdfast.ErrReleased) {
						leave()
						if errors.Is(cause, holdfast.ErrLost) {
							now := time.Now()
							lostAt.CompareAndSwap(nil, &now)
							pausedLost.Store(true)
						}
						tl.log(w.name, "told it lost the lock: %s", shortCause(cause))
					}
				}()

				if err := store.write(g.Token(), fmt.Sprintf("%s token %d", w.name, g.Token())); err != nil {
					tl.log(w.name, "write REJECTED: %v", err)
				} else {
					writesOK.Add(1)
					tl.log(w.name, "wrote ok (token %d)", g.Token())
				}

				if int(n) == o.PauseGrant {
					demoPause(runCtx, tl, w, g, &store, o, &pausedKey, &lostAt, &stale, &writesOK)
					staleDoneOnce.Do(func() { close(staleDone) })
					return // its session is gone: this worker retires
				}

				select {
				case <-time.After(o.Hold):
				case <-g.Context().Done():
				}
				leave()
				uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				if err := g.Unlock(uctx); err != nil {
					tl.log(w.name, "unlock: %v", err)
				}
				ucancel()
			}
		}()
	}

	select {
	case <-staleDone:
		select {
		case <-time.After(o.After):
		case <-ctx.Done():
		}
	case <-ctx.Done():
	}
	timedOut := ctx.Err() != nil
	stopRun()
	wg.Wait()

	res = demoResult{
		Grants:        int(grants.Load()),
		WritesOK:      int(writesOK.Load()),
		Overlaps:      int(overlaps.Load()),
		StaleRejected: int(stale.Load()),
		PausedLost:    pausedLost.Load(),
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "resource: %d writes accepted, highest token %d\n", res.WritesOK, store.fence.Max())
	fmt.Fprintln(out, "(overlaps: grants handed out while another holder's grant context was still live)")
	fmt.Fprintf(out, "summary: grants=%d overlaps=%d stale_writes_rejected=%d writes_ok=%d\n", res.Grants, res.Overlaps, res.StaleRejected, res.WritesOK)
	if timedOut && res.StaleRejected == 0 {
		return res, fmt.Errorf("demo did not finish within %v", o.Timeout)
	}
	if err := runSemaphoreAct(ctx, out, cluster); err != nil {
		return res, err
	}
	return res, nil
}

// demoPause plays the paused holder: it freezes the worker's connection,
// sleeps until its lease has expired and another holder has written with a
// newer token, then wakes and writes with its old token, ignoring the
// cancelled grant context.
func demoPause(ctx context.Context, tl *timeline, w *demoWorker, g holdfast.Grant, res *resource, o demoOptions, pausedKey *atomic.Pointer[string], lostAt *atomic.Pointer[time.Time], stale, writesOK *atomic.Int64) {
	key := g.Key()
	pausedKey.Store(&key)
	tl.log(w.name, "PAUSES (simulated stop-the-world: the worker and its connection to etcd freeze, so keepalives stop)")
	w.proxy.Pause()
	paused := time.Now()
	// Sleep past the TTL and until another holder has written with a newer
	// token (bounded, so that a broken store cannot hang the demo).
	limit := time.NewTimer(o.TTL * 4)
	defer limit.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-limit.C:
			break wait
		case <-tick.C:
			if time.Since(paused) > o.TTL && res.fence.Max() > g.Token() {
				break wait
			}
		}
	}
	state := "still live"
	if at := lostAt.Load(); at != nil {
		state = fmt.Sprintf("was cancelled %d ms ago", time.Since(*at).Milliseconds())
	} else if g.Context().Err() != nil {
		state = "cancelled: " + shortCause(context.Cause(g.Context()))
	}
	tl.log(w.name, "wakes after %d ms; its grant context %s", time.Since(paused).Milliseconds(), state)
	tl.log(w.name, "ignores that and writes with its old token %d", g.Token())
	if err := res.write(g.Token(), w.name+" stale write"); err != nil {
		if errors.Is(err, holdfast.ErrStaleToken) {
			stale.Add(1)
		}
		tl.log(w.name, "stale write REJECTED by the resource: %v", err)
	} else {
		writesOK.Add(1)
		tl.log(w.name, "stale write ACCEPTED (the resource saw no newer token)")
	}
	w.proxy.Mend()
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	err := g.Unlock(uctx)
	switch {
	case errors.Is(err, holdfast.ErrNotHeld):
		tl.log(w.name, "unlock: ErrNotHeld, as expected (its lock was lost); it retires")
	case err != nil:
		tl.log(w.name, "unlock: %v; it retires", err)
	default:
		tl.log(w.name, "unlock succeeded (unexpected: the lock should have been lost); it retires")
	}
}

// shortCause says in a few words why a grant ended, for the timeline.
func shortCause(err error) string {
	switch {
	case errors.Is(err, holdfast.ErrSessionClosed):
		return "its session was closed"
	case errors.Is(err, holdfast.ErrSessionLost):
		return "no keepalive acknowledged before the safe deadline"
	case errors.Is(err, holdfast.ErrReleased):
		return "released"
	case errors.Is(err, holdfast.ErrLost):
		return "its key was removed"
	}
	s := strings.ReplaceAll(err.Error(), "holdfast: ", "")
	if len(s) > 60 {
		s = s[:60] + "..."
	}
	return s
}
