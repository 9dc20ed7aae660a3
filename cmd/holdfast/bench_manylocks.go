package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/holdfast/holdfast/internal/bench"
)

// runManyLocks runs the many-locks scenario on t (which it closes) with the
// TTL, log and --duration of opts: the renewal traffic is counted over the
// session TTL or --duration, whichever is longer.
func runManyLocks(ctx context.Context, e *env, t bench.Target, locks string, opts bench.Options, jsonOut bool) error {
	mo := bench.ManyLocksOptions{TTL: opts.TTL, Window: max(opts.TTL, opts.Duration), Native: true, Log: opts.Log}
	var err error
	if mo.Locks, err = parseInts(locks); err != nil {
		t.Close()
		return usagef("--locks: %v", err)
	}
	if err := mo.Validate(); err != nil {
		t.Close()
		return usagef("%v", err)
	}
	if jsonOut {
		mo.OnResult = func(r bench.ManyLocksResult) { bench.WriteJSON(e.stdout, r) }
	}
	rows, runErr := bench.RunManyLocks(ctx, t, mo)
	if err := t.Close(); err != nil && runErr == nil {
		fmt.Fprintf(e.stderr, "holdfast bench: closing %s: %v\n", t.Backend(), err)
	}
	if !jsonOut && len(rows) > 0 {
		bench.WriteManyLocksTable(e.stdout, rows)
	}
	if runErr != nil {
		if errors.Is(runErr, bench.ErrUsage) {
			return usagef("%v", runErr)
		}
		return runErr
	}
	var lost, errs int
	for _, r := range rows {
		lost += r.Lost
		errs += r.Errors
	}
	if lost > 0 || errs > 0 {
		return fmt.Errorf("%d grants lost and %d errors (see the rows' first_error)", lost, errs)
	}
	return nil
}
