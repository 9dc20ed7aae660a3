package bench

import (
	"context"
	"time"
)

// ScenarioWaiters is the scale scenario of one lock with many waiters: for
// each number of waiters W (Options.Waiters, default 2, 16, 128, 512), W+1
// contenders loop on one lock (one holds, W wait), holding for 0 ms
// (Options.Hold), holdfast, native and floor alternating. Its rows report
// what a handoff costs as the queue grows: rpcs_per_acq, bytes_per_acq,
// handoff_p50_ms and handoff_p99_ms, acq_per_s and of_floor. Each round
// warms up for at least 2 ms per waiter, so that every waiter has queued
// before the window starts.
const ScenarioWaiters = "waiters"

// defaultWaiters are the waiters scenario's default numbers of waiters.
var defaultWaiters = []int{2, 16, 128, 512}

func (r *runner) waiters(ctx context.Context) error {
	ws := r.opts.Waiters
	if ws == nil {
		ws = defaultWaiters
	}
	hold := time.Duration(0)
	if r.opts.Hold != nil {
		hold = *r.opts.Hold
	}
	impls := withFloor(r.t, r.t.Impls())
	for _, w := range ws {
		rows, err := r.alternate(ctx, setting{scenario: ScenarioWaiters, n: w + 1, hold: hold, waiters: w}, impls)
		if err != nil {
			return err
		}
		r.emitRows(rows)
	}
	return nil
}
