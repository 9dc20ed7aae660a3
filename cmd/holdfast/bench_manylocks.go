package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/holdfast/holdfast/internal/bench"
)

// manyLocksOptions returns the options of the many-locks scenario from
// --locks and the TTL, log and --duration of opts: the renewal traffic is
// counted over the session TTL or --duration, whichever is longer. Errors
// are usage errors.
func manyLocksOptions(locks string, opts bench.Options) (bench.ManyLocksOptions, error) {
	mo := bench.ManyLocksOptions{TTL: opts.TTL, Window: max(opts.TTL, opts.Duration), Native: true, Log: opts.Log}
	var err error
	if mo.Locks, err = parseInts(locks); err != nil {
		return mo, usagef("--locks: %v", err)
	}
	if err := mo.Validate(); err != nil {
		return mo, usagef("--locks: %v", strings.TrimPrefix(err.Error(), bench.ErrUsage.Error()+": "))
	}
	return mo, nil
}

// runManyLocks runs the many-locks scenario on t, which it closes.
func runManyLocks(ctx context.Context, e *env, t bench.Target, locks string, opts bench.Options, jsonOut bool) error {
	mo, err := manyLocksOptions(locks, opts)
	if err != nil {
		t.Close()
		return err
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
