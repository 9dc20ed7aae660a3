//go:build !race

// The race detector inflates allocations, so this file is left out of
// -race builds; `make test` runs it in a separate build without -race.

package bench

import (
	"testing"
	"time"
)

// TestManyLocksMemory checks the many-locks promise on an embedded etcd:
// 10,000 grants held through one session cost at most 2 KiB each on the
// client side (heap plus stacks, the in-process server's own cost per lock
// subtracted) and no goroutine.
func TestManyLocksMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	target, err := StartEtcd()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	rows := runManyShort(t, target, ManyLocksOptions{Locks: []int{10000}, TTL: 2 * time.Second, Window: time.Second},
		[]string{ImplHoldfast})
	r := rows[1]
	t.Logf("%d grants: %s B per grant (server's own %s B per lock subtracted), %s goroutines per grant",
		r.Locks, fp(r.HeapBytesPerGrant), fp(r.ServerBytesPerLock), fp(r.GoroutinesPerGrant))
	if *r.HeapBytesPerGrant > 2048 {
		t.Errorf("%s B per grant, want at most 2 KiB", fp(r.HeapBytesPerGrant))
	}
}
