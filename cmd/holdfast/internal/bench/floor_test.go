package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/leakcheck"
)

func TestInitialTurns(t *testing.T) {
	for _, tc := range []struct{ index, count, tokens, want int }{
		{0, 4, 0, 1}, {1, 4, 0, 0}, {0, 4, 1, 1}, {3, 4, 1, 0},
		{1, 4, 2, 1}, {2, 4, 2, 0}, {0, 2, 3, 2}, {1, 2, 3, 1}, {0, 1, 4, 4},
	} {
		if got := initialTurns(ContenderConfig{Index: tc.index, Count: tc.count, Tokens: tc.tokens}); got != tc.want {
			t.Errorf("index %d of %d, %d tokens: %d turns, want %d", tc.index, tc.count, tc.tokens, got, tc.want)
		}
	}
}

// TestFloorRelay drives the floor's relay by hand on each store: turns go
// round in order, two turns written to one key before its owner reads it
// both arrive (a Consul blocking query sees only the last write, hence the
// turn counts in the values), a contender without a turn waits until its
// context ends, and a bad Index or Count is refused with errFloorConfig.
func TestFloorRelay(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd and a Consul agent")
	}
	for _, backend := range []string{"etcd", "consul"} {
		t.Run(backend, func(t *testing.T) {
			leakcheck.Check(t)
			target := startTarget(t, backend)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			fl := floorImpl(target)
			if _, err := fl.NewContender(ctx, ContenderConfig{Lock: "floor-test/bad", Counter: new(Counter), Index: 2, Count: 2}); !errors.Is(err, errFloorConfig) {
				t.Errorf("index 2 of 2: %v, want errFloorConfig", err)
			}
			// Two contenders, two tokens: each starts with one turn.
			cs := make([]Contender, 2)
			defer closeAll(cs)
			for i := range cs {
				var err error
				if cs[i], err = fl.NewContender(ctx, ContenderConfig{Lock: "floor-test/relay", Counter: new(Counter), Index: i, Count: 2, Tokens: 2}); err != nil {
					t.Fatal(err)
				}
			}
			lock := func(i int) Held {
				t.Helper()
				h, err := cs[i].Lock(ctx)
				if err != nil {
					t.Fatalf("contender %d: %v", i, err)
				}
				return h
			}
			unlock := func(h Held) {
				t.Helper()
				if err := h.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// 0 passes its turn to 1, which now has two.
			unlock(lock(0))
			h1, h2 := lock(1), lock(1)
			// Both go back to 0 before 0 looks: two writes to its key.
			unlock(h1)
			unlock(h2)
			time.Sleep(100 * time.Millisecond)
			a, b := lock(0), lock(0)
			// 1 has no turn left: its Lock waits until its context ends.
			short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := cs[1].Lock(short)
			stop()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("contender 1 without a turn: %v, want the context's deadline", err)
			}
			unlock(a)
			unlock(b)
			unlock(lock(1))
			unlock(lock(1))
		})
	}
}
