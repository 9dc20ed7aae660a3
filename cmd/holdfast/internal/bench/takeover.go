package bench

import (
	"context"
	"fmt"
	"time"
)

const (
	// settle is how long the waiter gets to start waiting (queue itself,
	// start its blocking query or watch) before the holder is killed.
	settle = 300 * time.Millisecond
	// takeoverSlack bounds a takeover beyond the lock-delay: api.Lock retries
	// a failed acquisition only every 5 s.
	takeoverSlack = 30 * time.Second
	// noticeWait bounds the wait for the killed holder to be told of its loss
	// once the waiter has the lock.
	noticeWait = 10 * time.Second
)

// takeover runs the takeover rows: for each lock-delay (Consul) or once
// (etcd), per implementation, Repeats times: a holder holds, a waiter waits,
// the holder's session is destroyed from another client, and the time until
// the waiter's Lock returns is measured.
func (r *runner) takeover(ctx context.Context) error {
	delays := r.opts.LockDelays
	if r.t.Backend() != "consul" {
		delays = []time.Duration{0}
	}
	for _, d := range delays {
		reps := r.opts.Repeats
		if reps == 0 {
			reps = 3
			if d >= 10*time.Second {
				reps = 2
			}
		}
		var rows []Result
		for _, impl := range r.t.Impls() {
			r.logf("%s takeover %s: lock-delay %v, %d repeats", r.t.Backend(), impl.Name(), d, reps)
			res, err := r.takeoverRow(ctx, impl, d, reps)
			if err != nil {
				return fmt.Errorf("%s takeover %s, lock-delay %v: %w", r.t.Backend(), impl.Name(), d, err)
			}
			r.emit(res)
			rows = append(rows, res)
		}
		r.pair(rows)
	}
	return nil
}

func (r *runner) takeoverRow(ctx context.Context, impl Impl, delay time.Duration, reps int) (Result, error) {
	res := Result{
		Scenario:   ScenarioTakeover,
		Backend:    r.t.Backend(),
		Impl:       impl.Name(),
		Contenders: 2,
		Nodes:      r.nodes(),
		RPCUnit:    r.t.RPCUnit(),
		TTLS:       r.opts.TTL.Seconds(),
		Repeats:    reps,
		Note:       takeoverNote(r.t.Backend(), impl.Name(), delay),
	}
	if r.t.Backend() == "consul" {
		res.LockDelayMS = num(ms(delay))
	} else {
		res.LockDelayMS = num(0)
	}
	var takeovers []time.Duration
	var noticeChs []<-chan time.Duration
	var rpcs int64
	start := time.Now()
	for rep := range reps {
		tk, nc, n, err := r.takeoverOnce(ctx, impl, delay, rep)
		rpcs += n
		if nc != nil {
			noticeChs = append(noticeChs, nc)
		}
		if err != nil {
			if ctx.Err() != nil {
				return Result{}, ctx.Err()
			}
			res.Errors++
			if res.FirstError == "" {
				res.FirstError = err.Error()
			}
			if v, ok := err.(violation); ok {
				res.Violations++
				res.FirstError = v.Error()
			}
			continue
		}
		res.Acquisitions++
		res.Handoffs++
		takeovers = append(takeovers, tk)
		res.TakeoverAll = append(res.TakeoverAll, round(ms(tk)))
	}
	var notices []time.Duration
	for _, nc := range noticeChs {
		if d := <-nc; d >= 0 {
			notices = append(notices, d)
		}
	}
	res.DurationS = round(time.Since(start).Seconds())
	res.TakeoverMS = percentile(takeovers, 0.5)
	res.NoticeMS = percentile(notices, 0.5)
	res.RPCs = rpcs
	if res.Acquisitions > 0 {
		res.RPCsPerAcq = num(float64(rpcs) / float64(res.Acquisitions))
	}
	return res, nil
}

// violation is a takeover error where the waiter got the lock while the
// holder's session was still alive.
type violation struct{ error }

// takeoverOnce measures one takeover. It returns the takeover time, a
// channel that yields the notice time once known (-1 if the holder was not
// told within noticeWait; the holder is closed in the background meanwhile,
// so that slow notices do not serialize the repeats), and the requests the
// waiter sent from the kill to its acquisition.
func (r *runner) takeoverOnce(ctx context.Context, impl Impl, delay time.Duration, rep int) (takeover time.Duration, notice <-chan time.Duration, rpcs int64, err error) {
	name := r.lockName(ScenarioTakeover, impl.Name(), fmt.Sprintf("d%dms", delay.Milliseconds()), rep)
	cfg := ContenderConfig{Lock: name, TTL: r.opts.TTL, LockDelay: delay}
	cfg.Counter = new(Counter)
	holder, err := impl.NewContender(ctx, cfg)
	if err != nil {
		return 0, nil, 0, fmt.Errorf("holder: %w", err)
	}
	unlockCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	}
	var h Held
	holderDone := func(killed time.Time) <-chan time.Duration {
		ch := make(chan time.Duration, 1)
		go func() {
			d := time.Duration(-1)
			if h.Lost != nil && !killed.IsZero() {
				select {
				case <-h.Lost:
					d = time.Since(killed)
				case <-time.After(noticeWait):
				}
			}
			if h.Unlock != nil {
				uctx, cancel := unlockCtx()
				h.Unlock(uctx) // fails after a kill: the session is gone
				cancel()
			}
			holder.Close()
			ch <- d
		}()
		return ch
	}

	wcfg := cfg
	wcfg.Counter = new(Counter)
	waiter, err := impl.NewContender(ctx, wcfg)
	if err != nil {
		return 0, holderDone(time.Time{}), 0, fmt.Errorf("waiter: %w", err)
	}
	defer waiter.Close()

	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	h, err = holder.Lock(lctx)
	lcancel()
	if err != nil {
		return 0, holderDone(time.Time{}), 0, fmt.Errorf("holder lock: %w", err)
	}

	type got struct {
		at  time.Time
		h   Held
		err error
	}
	wctx, wcancel := context.WithTimeout(ctx, settle+delay+takeoverSlack)
	defer wcancel()
	gotc := make(chan got, 1)
	go func() {
		wh, err := waiter.Lock(wctx)
		gotc <- got{time.Now(), wh, err}
	}()
	release := func(g got) {
		if g.err == nil {
			uctx, cancel := unlockCtx()
			g.h.Unlock(uctx)
			cancel()
		}
	}

	select {
	case g := <-gotc:
		release(g)
		if g.err != nil {
			return 0, holderDone(time.Time{}), 0, fmt.Errorf("waiter lock: %w", g.err)
		}
		return 0, holderDone(time.Time{}), 0, violation{fmt.Errorf("waiter acquired while the holder's session was alive")}
	case <-time.After(settle):
	}

	w0 := wcfg.Counter.Requests()
	kctx, kcancel := context.WithTimeout(ctx, 10*time.Second)
	err = r.t.Kill(kctx, holder.SessionID())
	kcancel()
	killed := time.Now()
	if err != nil {
		wcancel()
		release(<-gotc)
		return 0, holderDone(time.Time{}), 0, fmt.Errorf("kill holder session: %w", err)
	}
	notice = holderDone(killed)
	g := <-gotc
	rpcs = wcfg.Counter.Requests() - w0
	release(g)
	if g.err != nil {
		return 0, notice, rpcs, fmt.Errorf("waiter lock after kill: %w", g.err)
	}
	return g.at.Sub(killed), notice, rpcs, nil
}

func takeoverNote(backend, impl string, delay time.Duration) string {
	switch {
	case backend == "etcd":
		return "holder's lease revoked by another client (etcd has no lock-delay); notice_ms: until the holder is told (holdfast grant context / concurrency.Session.Done)"
	case impl == ImplNative && delay == 0:
		return "api.Lock on a session created by a raw PUT /v1/session/create with \"LockDelay\":\"0s\" (the Go api omits a zero LockDelay and the server then applies 15s); notice_ms: until api.Lock's lost channel closes"
	case impl == ImplNative:
		return "api.Lock on a session created with api.SessionEntry{LockDelay}; notice_ms: until api.Lock's lost channel closes"
	default:
		return "holdfast consul session with WithLockDelay; notice_ms: until the grant context is cancelled"
	}
}
