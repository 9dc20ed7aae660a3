package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	hfetcd "github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/leader"
)

// electionAct is the demo's third act: a leader election failover.
type electionAct struct {
	Candidates int
	TTL        time.Duration
	Timeout    time.Duration
}

var defaultElectionAct = electionAct{Candidates: 3, TTL: hfetcd.MinTTL, Timeout: 20 * time.Second}

// electionResult is the third act's summary.
type electionResult struct {
	Terms     []holdfast.Token // in order of OnStartedLeading
	Failover  time.Duration    // from the leader's freeze to the next OnStartedLeading
	ToldFirst bool             // the frozen leader's context ended before the next leader started
	Stale     int              // writes of the frozen leader that the fence refused
}

// ok: a second leader with a higher term, the frozen leader told first,
// and a failover within TTL + 0.5 s (etcd revokes expired leases on a
// 500 ms tick) with 0.5 s to spare for a loaded machine.
func (r electionResult) ok(a electionAct) bool {
	return len(r.Terms) >= 2 && r.Terms[1] > r.Terms[0] && r.ToldFirst && r.Failover <= a.TTL+time.Second
}

// runElectionAct runs the third act: candidates run leader.Run on one etcd
// Election; the leader writes to a fenced resource; it is frozen (its
// connection paused, as in a long GC pause), is told it lost leadership
// before its lease expires on the server, and another candidate takes over
// within the TTL, with a higher term.
func runElectionAct(ctx context.Context, out io.Writer, a electionAct) (electionResult, error) {
	var res electionResult // shared with the candidates: under mu
	const name = "holdfast-demo/leader"
	fmt.Fprintf(out, "\nAct 3: leader election. %d candidates run leader.Run on one etcd Election %q (TTL %v).\n", a.Candidates, name, a.TTL)
	fmt.Fprintln(out, "The leader's term (the create revision of its key) is its fencing token. The leader is frozen,")
	fmt.Fprintln(out, "as in a long GC pause: it is told it lost leadership before its lease expires, then another")
	fmt.Fprintln(out, "candidate takes over with a higher term. The frozen leader's late write is refused by the fence.")
	fmt.Fprintln(out)
	cluster, err := etcdtest.StartEtcd("", 1)
	if err != nil {
		return res, fmt.Errorf("start embedded etcd: %w", err)
	}
	defer cluster.Close()
	ep, err := url.Parse(cluster.Endpoints()[0])
	if err != nil {
		return res, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.Timeout)
	defer cancel()

	tl := &timeline{w: out, start: time.Now()}
	var (
		fence    holdfast.Fence
		mu       sync.Mutex
		frozen   = -1      // the candidate that is frozen
		frozenAt time.Time // when
		endedAt  time.Time // when the frozen leader's context ended
		second   = make(chan struct{})
		proxies  []*embedtest.Proxy
		sessions []*hfetcd.Session
		wg       sync.WaitGroup
	)
	runCtx, stopRun := context.WithCancel(ctx)
	defer func() {
		stopRun()
		for _, p := range proxies {
			p.Mend()
		}
		wg.Wait()
		for i, s := range sessions {
			_ = s.Close()
			proxies[i].Close()
		}
	}()
	first := make(chan int, a.Candidates)
	for i := range a.Candidates {
		who := fmt.Sprintf("candidate-%d", i+1)
		p, err := embedtest.NewProxy(ep.Host)
		if err != nil {
			return res, err
		}
		proxies = append(proxies, p)
		s, err := hfetcd.Dial(ctx, []string{p.URL()}, hfetcd.WithTTL(a.TTL))
		if err != nil {
			return res, err
		}
		sessions = append(sessions, s)
		e, err := hfetcd.NewElection(s, name)
		if err != nil {
			return res, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := leader.Config[*hfetcd.Grant]{
				Value:          []byte(who),
				ResignOnCancel: true,
				OnStartedLeading: func(lctx context.Context, g *hfetcd.Grant) {
					mu.Lock()
					res.Terms = append(res.Terms, g.Token())
					n := len(res.Terms)
					if n == 2 {
						res.Failover = time.Since(frozenAt)
						res.ToldFirst = !endedAt.IsZero()
					}
					mu.Unlock()
					if n == 1 {
						tl.log(who, "leads, term %d", g.Token())
					} else {
						tl.log(who, "leads, term %d, %d ms after the freeze", g.Token(), res.Failover.Milliseconds())
					}
					if err := fence.Admit(g.Token()); err != nil {
						tl.log(who, "write REJECTED: %v", err)
					} else {
						tl.log(who, "wrote with term %d", g.Token())
					}
					if n == 2 {
						close(second) // the frozen leader wakes after this write
					}
					if n == 1 {
						first <- i
					}
					<-lctx.Done()
					mu.Lock()
					if i == frozen && endedAt.IsZero() {
						endedAt = time.Now()
					}
					mu.Unlock()
					if i == frozen {
						tl.log(who, "told it lost leadership: %s", shortCause(context.Cause(lctx)))
						<-second // still frozen: it wakes after the next leader wrote
						tl.log(who, "wakes up and writes anyway with its old term %d", g.Token())
						if err := fence.Admit(g.Token()); err != nil {
							mu.Lock()
							res.Stale++
							mu.Unlock()
							tl.log(who, "stale write REJECTED: %v", err)
						} else {
							tl.log(who, "stale write ACCEPTED: the fence failed")
						}
					}
				},
			}
			_ = leader.Run(runCtx, e, cfg)
		}()
	}
	var l int
	select {
	case l = <-first:
	case <-ctx.Done():
		return res, fmt.Errorf("no leader within %v", a.Timeout)
	}
	time.Sleep(300 * time.Millisecond) // the others wait behind the leader
	mu.Lock()
	frozen, frozenAt = l, time.Now()
	mu.Unlock()
	tl.log(fmt.Sprintf("candidate-%d", l+1), "FREEZES (its connection to etcd is paused)")
	proxies[l].Pause()
	select {
	case <-second:
	case <-ctx.Done():
		return res, fmt.Errorf("no failover within %v", a.Timeout)
	}
	time.Sleep(100 * time.Millisecond) // the stale write
	mu.Lock()
	defer mu.Unlock()
	res.Terms = slices.Clone(res.Terms)
	tl.mu.Lock() // candidates may still log
	defer tl.mu.Unlock()
	fmt.Fprintf(out, "\nact 3 summary: terms=%v failover_ms=%d told_first=%v stale_writes_rejected=%d\n", res.Terms, res.Failover.Milliseconds(), res.ToldFirst, res.Stale)
	return electionResult{Terms: res.Terms, Failover: res.Failover, ToldFirst: res.ToldFirst, Stale: res.Stale}, nil
}
