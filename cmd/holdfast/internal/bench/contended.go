package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// stopGrace bounds how long contenders may take to return after a row's
// window ends (a Lock in flight is cancelled; api.Lock may first finish one
// blocking query).
const stopGrace = 30 * time.Second

// errorBackoff is the pause after a failed Lock or Unlock, so that a broken
// store does not turn a row into a hot loop.
const errorBackoff = 20 * time.Millisecond

// contended runs the rows of scenario lock or handoff.
func (r *runner) contended(ctx context.Context, scenario string) error {
	counts := r.opts.Contenders
	hold := time.Duration(0)
	switch scenario {
	case ScenarioLock:
		if counts == nil {
			counts = []int{1, 8, 32}
		}
	case ScenarioHandoff:
		if counts == nil {
			counts = []int{8, 32}
		}
		hold = time.Millisecond
	}
	if r.opts.Hold != nil {
		hold = *r.opts.Hold
	}
	impls := withFloor(r.t, r.t.Impls())
	for _, n := range counts {
		rows, err := r.alternate(ctx, setting{scenario: scenario, n: n, hold: hold}, impls)
		if err != nil {
			return err
		}
		r.emitRows(rows)
	}
	return nil
}

// withFloor returns impls followed by t's floor, if t has one.
func withFloor(t Target, impls []Impl) []Impl {
	if fl := floorImpl(t); fl != nil {
		return append(impls, fl)
	}
	return impls
}

// setting is one contended setting: n contenders, each holding for hold;
// limit > 0 makes it a semaphore's (up to limit holders at once) and
// waiters > 0 a waiters row.
type setting struct {
	scenario string
	n        int
	hold     time.Duration
	limit    int
	waiters  int
}

// holders is how many may be inside at once.
func (s setting) holders() int { return max(1, s.limit) }

func (s setting) String() string {
	out := fmt.Sprintf("%d contenders, hold %v", s.n, s.hold)
	if s.limit > 0 {
		out += fmt.Sprintf(", limit %d", s.limit)
	}
	return out
}

// emitRows sets of_floor on the rows of one setting, emits them and their
// holdfast/native ratio.
func (r *runner) emitRows(rows []Result) {
	setOfFloor(rows)
	for _, res := range rows {
		r.emit(res)
	}
	r.pair(rows)
}

// setOfFloor sets OfFloor on every row but the floor's: its acq_per_s
// divided by the floor's.
func setOfFloor(rows []Result) {
	var floor *Result
	for i := range rows {
		if rows[i].Impl == ImplFloor {
			floor = &rows[i]
		}
	}
	if floor == nil {
		return
	}
	for i := range rows {
		if rows[i].Impl != ImplFloor {
			rows[i].OfFloor = div(rows[i].AcqPerS, floor.AcqPerS)
		}
	}
}

// rounds returns the number of alternation rounds, and the warm-up and
// measured window of each.
func (r *runner) rounds() (int, time.Duration, time.Duration) {
	n := r.opts.Rounds
	return n, r.opts.Warmup / time.Duration(n), r.opts.Duration / time.Duration(n)
}

// group is one implementation's contenders for one setting.
type group struct {
	impl     Impl
	cs       []Contender
	counters []*Counter
	acc      rowAcc
}

// alternate measures impls with n contenders each: it opens every
// implementation's contenders, then runs Rounds rounds, each a window per
// implementation in turn, so that drift on the machine hits all of them,
// and returns one row per implementation aggregated over the rounds.
func (r *runner) alternate(ctx context.Context, set setting, impls []Impl) ([]Result, error) {
	rounds, warmup, window := r.rounds()
	if set.waiters > 0 {
		// Every waiter must have queued before a window starts.
		warmup = max(warmup, time.Duration(set.waiters)*2*time.Millisecond)
	}
	scenario, n := set.scenario, set.n
	groups := make([]*group, len(impls))
	defer func() {
		for _, g := range groups {
			if g != nil {
				closeAll(g.cs)
			}
		}
	}()
	setupStart := time.Now()
	for k, impl := range impls {
		g := &group{impl: impl, cs: make([]Contender, n), counters: make([]*Counter, n)}
		groups[k] = g
		g.acc.perContender = make([]int, n)
		name := r.lockName(scenario, impl.Name(), fmt.Sprintf("n%d-l%d-h%v", n, set.limit, set.hold))
		if err := r.openContenders(ctx, impl, name, set.holders(), g.cs, g.counters); err != nil {
			return nil, fmt.Errorf("%s %s %s, %v: %w", r.t.Backend(), scenario, impl.Name(), set, err)
		}
	}
	r.logf("%s %s: %v: %d implementations ready in %v; %d rounds of %v warm-up + %v each",
		r.t.Backend(), scenario, set, len(impls), time.Since(setupStart).Round(time.Millisecond), rounds, warmup, window)
	for round := range rounds {
		for _, g := range groups {
			r.logf("%s %s %s: %v, round %d/%d", r.t.Backend(), scenario, g.impl.Name(), set, round+1, rounds)
			if err := r.window(ctx, g, set, warmup, window); err != nil {
				return nil, fmt.Errorf("%s %s %s, %v: %w", r.t.Backend(), scenario, g.impl.Name(), set, err)
			}
		}
	}
	rows := make([]Result, len(groups))
	for k, g := range groups {
		rows[k] = r.contendedResult(set, g)
	}
	return rows, nil
}

// openContenders opens len(cs) contenders of impl on the lock name, at most
// setupParallel at a time, within setupTimeout.
func (r *runner) openContenders(ctx context.Context, impl Impl, name string, tokens int, cs []Contender, counters []*Counter) error {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	sem := make(chan struct{}, setupParallel)
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for i := range cs {
		counters[i] = new(Counter)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := impl.NewContender(ctx, ContenderConfig{Lock: name, Counter: counters[i], TTL: r.opts.TTL, LockDelay: -1, Index: i, Count: len(cs), Tokens: tokens})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = fmt.Errorf("contender %d: %w", i, err)
				}
				return
			}
			cs[i] = c
		}()
	}
	wg.Wait()
	return first
}

const (
	// setupParallel bounds the contenders opened at once.
	setupParallel = 32
	// setupTimeout bounds the opening of one implementation's contenders.
	setupTimeout = 2 * time.Minute
)

// handoffState is what contenders share about the lock, for measurement
// only: who took it last and when that holder called Unlock.
type handoffState struct {
	mu       sync.Mutex
	holder   int // -1: nobody yet
	unlockAt time.Time
}

// contenderStats are one contender's measurements in one window; only its
// goroutine writes them until the window ends.
type contenderStats struct {
	acquisitions int
	handoffs     []time.Duration
	waits        []time.Duration
	cycles       []time.Duration
}

// rowAcc accumulates one implementation's measurements over its windows.
type rowAcc struct {
	perContender         []int
	handoffs, waits      []time.Duration
	cycles               []time.Duration
	rpcs, streams, bytes int64
	violations, errors   int
	firstErr             error
	measured             time.Duration
}

// window runs g's contenders for one warm-up and one measured window and
// adds what it measured to g.acc.
func (r *runner) window(ctx context.Context, g *group, set setting, warmup, window time.Duration) error {
	n, hold, most := len(g.cs), set.hold, int32(set.holders())
	var (
		inside     atomic.Int32
		violations atomic.Int64
		errCount   atomic.Int64
		firstErr   atomic.Pointer[error]
		state      = handoffState{holder: -1}
		stats      = make([]contenderStats, n)
	)
	fail := func(err error) {
		errCount.Add(1)
		firstErr.CompareAndSwap(nil, &err)
	}

	start := time.Now()
	winStart := start.Add(warmup)
	winEnd := winStart.Add(window)
	runCtx, cancel := context.WithDeadline(ctx, winEnd)
	defer cancel()

	// Snapshot the request counters at the window's edges.
	var s0, s1 counts
	snapDone := make(chan struct{})
	go func() {
		defer close(snapDone)
		t := time.NewTimer(time.Until(winStart))
		defer t.Stop()
		select {
		case <-t.C:
		case <-runCtx.Done():
		}
		s0 = sumCounters(g.counters)
		<-runCtx.Done()
		s1 = sumCounters(g.counters)
	}()

	var wg sync.WaitGroup
	for i, c := range g.cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := &stats[i]
			for runCtx.Err() == nil {
				t0 := time.Now()
				h, err := c.Lock(runCtx)
				if err != nil {
					// An error at or after the window's end is the end: the
					// server's copy of the deadline (etcd answers "request
					// timed out") can arrive before this goroutine's timer
					// has cancelled runCtx.
					if runCtx.Err() != nil || !time.Now().Before(winEnd) {
						return
					}
					fail(fmt.Errorf("lock: %w", err))
					sleepCtx(runCtx, errorBackoff)
					continue
				}
				t1 := time.Now()
				if inside.Add(1) > most {
					violations.Add(1)
				}
				state.mu.Lock()
				prev, prevAt := state.holder, state.unlockAt
				state.holder = i
				state.mu.Unlock()

				in := !t1.Before(winStart) && t1.Before(winEnd)
				if in {
					st.acquisitions++
					st.waits = append(st.waits, t1.Sub(t0))
					if prev >= 0 && prev != i && set.limit == 0 {
						st.handoffs = append(st.handoffs, t1.Sub(prevAt))
					}
				}
				if hold > 0 {
					time.Sleep(hold)
				}
				inside.Add(-1)
				tu := time.Now()
				state.mu.Lock()
				state.unlockAt = tu
				state.mu.Unlock()
				// Unlock with a context of its own: the row's end must not
				// leave a grant behind.
				uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				err = h.Unlock(uctx)
				ucancel()
				if err != nil {
					fail(fmt.Errorf("unlock: %w", err))
					sleepCtx(runCtx, errorBackoff)
					continue
				}
				if in {
					st.cycles = append(st.cycles, time.Since(t0))
				}
			}
		}()
	}
	<-runCtx.Done()
	if !waitTimeout(&wg, stopGrace) {
		fail(fmt.Errorf("contenders did not stop within %v of the window's end", stopGrace))
	}
	<-snapDone
	if err := ctx.Err(); err != nil {
		return err
	}
	a := &g.acc
	for i, st := range stats {
		a.perContender[i] += st.acquisitions
		a.handoffs = append(a.handoffs, st.handoffs...)
		a.waits = append(a.waits, st.waits...)
		a.cycles = append(a.cycles, st.cycles...)
	}
	a.rpcs += s1.requests - s0.requests
	a.streams += s1.streams - s0.streams
	a.bytes += s1.bytes - s0.bytes
	a.violations += int(violations.Load())
	a.errors += int(errCount.Load())
	if p := firstErr.Load(); p != nil && a.firstErr == nil {
		a.firstErr = *p
	}
	a.measured += window
	return nil
}

// counts are summed Counter readings.
type counts struct{ requests, streams, bytes int64 }

func sumCounters(cs []*Counter) counts {
	var s counts
	for _, c := range cs {
		if c == nil {
			continue
		}
		s.requests += c.Requests()
		s.streams += c.Streams()
		s.bytes += c.Bytes()
	}
	return s
}

// contendedResult turns g's accumulated measurements into a row.
func (r *runner) contendedResult(set setting, g *group) Result {
	a := &g.acc
	n := set.n
	res := Result{
		Scenario:   set.scenario,
		Backend:    r.t.Backend(),
		Impl:       g.impl.Name(),
		Contenders: n,
		Nodes:      r.nodes(),
		HoldMS:     round(ms(set.hold)),
		DurationS:  round(a.measured.Seconds()),
		Rounds:     r.opts.Rounds,
		RPCUnit:    r.t.RPCUnit(),
		TTLS:       r.opts.TTL.Seconds(),
		Violations: a.violations,
		Errors:     a.errors,
	}
	for _, x := range a.perContender {
		res.Acquisitions += x
	}
	if set.limit > 0 {
		res.Limit = &set.limit
	}
	if set.waiters > 0 {
		res.Waiters = &set.waiters
	}
	secs := a.measured.Seconds()
	res.AcqPerS = round(float64(res.Acquisitions) / secs)
	if set.limit == 0 {
		res.Handoffs = len(a.handoffs)
		res.HandoffsPerS = round(float64(res.Handoffs) / secs)
		res.HandoffP50MS = percentile(a.handoffs, 0.50)
		res.HandoffP99MS = percentile(a.handoffs, 0.99)
	}
	res.WaitP50MS = percentile(a.waits, 0.50)
	res.WaitP99MS = percentile(a.waits, 0.99)
	if n == 1 {
		res.CycleP50MS = percentile(a.cycles, 0.50)
	}
	res.Fairness = jain(a.perContender)
	res.RPCs = a.rpcs
	if res.Acquisitions > 0 {
		res.RPCsPerAcq = num(float64(a.rpcs) / float64(res.Acquisitions))
		res.BytesPerAcq = num(float64(a.bytes) / float64(res.Acquisitions))
		if r.t.Backend() == "etcd" {
			res.StreamsPerAcq = num(float64(a.streams) / float64(res.Acquisitions))
		}
	}
	if a.firstErr != nil {
		res.FirstError = a.firstErr.Error()
	}
	if g.impl.Name() == ImplFloor {
		res.Note = floorNote
	}
	return res
}

// floorNote is the note of floor rows.
const floorNote = "a relay: one write and one notification per turn, no safety, the store's own limit (see the package doc)"

// closeAll closes every non-nil contender, concurrently.
func closeAll(cs []Contender) {
	var wg sync.WaitGroup
	for _, c := range cs {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Close()
		}()
	}
	wg.Wait()
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func randomID() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}
