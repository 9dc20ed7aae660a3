package core

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Dispose removes at once when it can; else it retries in the background
// until remove succeeds, or until within has passed.
func TestDispose(t *testing.T) {
	for _, tc := range []struct {
		name          string
		fails         int32 // attempts that fail before one succeeds
		within        time.Duration
		after10, more int32 // calls after 10 s and 20 s; -1: retried, then stopped; -2: still retried
	}{
		{"works", 0, 0, 1, 1},
		{"fails 3 times", 3, 0, 4, 4},
		{"always fails, within 5 s", 1000, 5 * time.Second, -1, -1},
		{"always fails, no bound", 1000, 0, -1, -2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newSession()
				defer s.close()
				var calls atomic.Int32
				ctx, cancel := context.WithCancel(context.Background())
				cancel() // the first attempt has ctx's values, not its end
				Dispose(ctx, s.bg, Backoff{}, tc.within, func(ctx context.Context) error {
					if calls.Add(1) <= tc.fails {
						return errTransport
					}
					return nil
				})
				time.Sleep(10 * time.Second)
				synctest.Wait()
				after10 := calls.Load()
				time.Sleep(10 * time.Second)
				synctest.Wait()
				more := calls.Load()
				switch {
				case tc.after10 >= 0 && (after10 != tc.after10 || more != tc.more):
					t.Errorf("calls %d after 10 s, %d after 20 s; want %d, %d", after10, more, tc.after10, tc.more)
				case tc.after10 < 0 && after10 < 2:
					t.Errorf("calls %d after 10 s; want retries", after10)
				case tc.more == -1 && more != after10:
					t.Errorf("calls %d after 10 s, %d after 20 s: retried beyond within", after10, more)
				case tc.more == -2 && more == after10:
					t.Errorf("calls %d after 10 s and after 20 s: no retry without a bound", after10)
				}
			})
		})
	}
}
