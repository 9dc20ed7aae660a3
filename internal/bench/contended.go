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
	for _, n := range counts {
		var rows []Result
		for _, impl := range r.t.Impls() {
			r.logf("%s %s %s: %d contenders, hold %v, %v warm-up + %v", r.t.Backend(), scenario, impl.Name(), n, hold, r.opts.Warmup, r.opts.Duration)
			res, err := r.contendedRow(ctx, scenario, impl, n, hold)
			if err != nil {
				return fmt.Errorf("%s %s %s, %d contenders: %w", r.t.Backend(), scenario, impl.Name(), n, err)
			}
			r.emit(res)
			rows = append(rows, res)
		}
		r.pair(rows)
	}
	return nil
}

// handoffState is what contenders share about the lock, for measurement
// only: who took it last and when that holder called Unlock.
type handoffState struct {
	mu       sync.Mutex
	holder   int // -1: nobody yet
	unlockAt time.Time
}

// contenderStats are one contender's measurements; only its goroutine writes
// them until the row ends.
type contenderStats struct {
	acquisitions int
	handoffs     []time.Duration
	waits        []time.Duration
	cycles       []time.Duration
}

func (r *runner) contendedRow(ctx context.Context, scenario string, impl Impl, n int, hold time.Duration) (Result, error) {
	name := r.lockName(scenario, impl.Name(), fmt.Sprintf("n%d", n))
	counters := make([]*Counter, n)
	cs := make([]Contender, n)
	defer closeAll(cs)
	for i := range cs {
		counters[i] = new(Counter)
		c, err := impl.NewContender(ctx, ContenderConfig{Lock: name, Counter: counters[i], TTL: r.opts.TTL, LockDelay: -1})
		if err != nil {
			return Result{}, fmt.Errorf("contender %d: %w", i, err)
		}
		cs[i] = c
	}

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
	winStart := start.Add(r.opts.Warmup)
	winEnd := winStart.Add(r.opts.Duration)
	runCtx, cancel := context.WithDeadline(ctx, winEnd)
	defer cancel()

	// Snapshot the request counters at the window's edges.
	var rpc0, rpc1, st0, st1 int64
	snapDone := make(chan struct{})
	go func() {
		defer close(snapDone)
		sum := func() (a, b int64) {
			for _, c := range counters {
				a += c.Requests()
				b += c.Streams()
			}
			return a, b
		}
		t := time.NewTimer(time.Until(winStart))
		defer t.Stop()
		select {
		case <-t.C:
			rpc0, st0 = sum()
		case <-runCtx.Done():
			rpc0, st0 = sum()
		}
		<-runCtx.Done()
		rpc1, st1 = sum()
	}()

	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := &stats[i]
			for runCtx.Err() == nil {
				t0 := time.Now()
				h, err := c.Lock(runCtx)
				if err != nil {
					if runCtx.Err() != nil {
						return
					}
					fail(fmt.Errorf("lock: %w", err))
					sleepCtx(runCtx, errorBackoff)
					continue
				}
				t1 := time.Now()
				if inside.Add(1) != 1 {
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
					if prev >= 0 && prev != i {
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
		return Result{}, err
	}

	res := Result{
		Scenario:   scenario,
		Backend:    r.t.Backend(),
		Impl:       impl.Name(),
		Contenders: n,
		HoldMS:     round(ms(hold)),
		DurationS:  round(r.opts.Duration.Seconds()),
		RPCUnit:    r.t.RPCUnit(),
		TTLS:       r.opts.TTL.Seconds(),
		Violations: int(violations.Load()),
		Errors:     int(errCount.Load()),
	}
	var handoffs, waits, cycles []time.Duration
	perContender := make([]int, n)
	for i, st := range stats {
		perContender[i] = st.acquisitions
		res.Acquisitions += st.acquisitions
		handoffs = append(handoffs, st.handoffs...)
		waits = append(waits, st.waits...)
		cycles = append(cycles, st.cycles...)
	}
	secs := r.opts.Duration.Seconds()
	res.Handoffs = len(handoffs)
	res.AcqPerS = round(float64(res.Acquisitions) / secs)
	res.HandoffsPerS = round(float64(res.Handoffs) / secs)
	res.HandoffP50MS = percentile(handoffs, 0.50)
	res.HandoffP99MS = percentile(handoffs, 0.99)
	res.WaitP50MS = percentile(waits, 0.50)
	res.WaitP99MS = percentile(waits, 0.99)
	if n == 1 {
		res.CycleP50MS = percentile(cycles, 0.50)
	}
	res.Fairness = jain(perContender)
	res.RPCs = rpc1 - rpc0
	if res.Acquisitions > 0 {
		res.RPCsPerAcq = num(float64(res.RPCs) / float64(res.Acquisitions))
		if r.t.Backend() == "etcd" {
			res.StreamsPerAcq = num(float64(st1-st0) / float64(res.Acquisitions))
		}
	}
	if p := firstErr.Load(); p != nil {
		res.FirstError = (*p).Error()
	}
	return res, nil
}

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
