//go:build holdfast_mutants

package safety

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/core"
)

// The scenarios that catch the broken variants, in the build with the tag
// holdfast_mutants only (TestBrokenVariants builds it and runs them with each
// variant; scripts/mutants.sh runs them too). Built without a variant, they
// must pass.

// slowClock is the rate of the clients' clock in TestSlowClockMargin: 18%
// slow, inside the bound of 20% (margin/TTL, the default margin) that
// docs/SAFETY.md assumes.
const slowClock = 0.82

// variantDuration is how long each of these scenarios runs: 20 s, or
// HOLDFAST_VARIANT_DURATION.
func variantDuration(t *testing.T) time.Duration {
	if s := os.Getenv("HOLDFAST_VARIANT_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("HOLDFAST_VARIANT_DURATION=%q: %v", s, err)
		}
		return d
	}
	return 20 * time.Second
}

// TestSlowClockMargin: the clients' clock runs at 0.82 of the store's, and
// every grant is held for 8 s, while the holder's connection is blackholed
// for 3 to 4 s (beyond the 2 s TTL) every 4.5 to 6.5 s, so its lease expires
// and a waiter is granted the lock (about 4 times in 20 s). With the margin (TTL/5), the holder's
// deadline, TTL - margin after its last renewal was sent counted on its slow
// clock, is 1.6 s / 0.82 = 1.95 s in real time: before etcd can expire the
// lease. Without it (core/margin) it is 2 s / 0.82 = 2.44 s, after etcd
// expires the lease (2 to 2.5 s after it received the renewal, as its
// lessor looks every 500 ms): each time, in about 5 cases out of 6, the
// waiter is granted while the holder still believes it holds, and the
// told-first checker fails.
func TestSlowClockMargin(t *testing.T) {
	if err := core.SetClockRate(slowClock); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = core.SetClockRate(1) }()
	s, err := RunEtcd(context.Background(), EtcdOptions{
		Duration: variantDuration(t), Faults: []string{"blackhole-client"},
		HolderFaults: true, LongHolds: 1, Log: testLog{t},
	})
	check(t, s, err)
	if s.Ended == 0 {
		t.Error("no fault ended a grant: the scenario did not test the margin")
	}
}

// TestWaiterKeysDeleted: an operator deletes waiting contenders' keys, every
// 0.5 to 1.5 s. A waiter whose key is gone must fail, not hold beside the
// holder; without its own-key re-check (etcd/recheck-own-key), it takes a
// phantom grant and the told-first checker fails.
func TestWaiterKeysDeleted(t *testing.T) {
	s, err := RunEtcd(context.Background(), EtcdOptions{
		Duration: variantDuration(t), Faults: []string{"delete-waiter-key"}, Log: testLog{t},
	})
	check(t, s, err)
	if s.Faults["delete-waiter-key"] == 0 {
		t.Error("no waiter's key was deleted")
	}
}

// TestHolderKeyDeleted: an operator deletes a holder's key while the
// holder's connection is frozen, every 0.5 to 2.5 s; the holder calls Unlock
// before it can hear of it, after the next waiter was granted. Its guarded
// release finds the key gone and Unlock reports ErrNotHeld; without the
// guard (etcd/release-guard), the release deletes whatever is at the key
// and Unlock reports success for a grant that a newer one had superseded,
// and the release checker fails. (The guard's own harm, a newer key of
// the same lease deleted, needs a second writer of the lease:
// etcd.TestStaleUnlockLeavesNewerKey.)
func TestHolderKeyDeleted(t *testing.T) {
	s, err := RunEtcd(context.Background(), EtcdOptions{
		Duration: variantDuration(t), Faults: []string{"delete-holder-key"}, LongHolds: -1, Log: testLog{t},
	})
	check(t, s, err)
	if s.Faults["delete-holder-key"] == 0 {
		t.Error("no holder's key was deleted")
	}
}
