package consul

import (
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/conformance"
)

// conformanceTTL is the session TTL of the conformance harness.
const conformanceTTL = 10 * time.Second

// TestConformance runs the shared suite: each Locker has a session of its
// own (TTL 10 s, lock-delay 0) on a client of its own, and kill destroys that
// session through another client, as Consul does when it invalidates one.
func TestConformance(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	conformance.Run(t, conformance.Backend{
		NewLocker: func(t *testing.T, name string, opts ...holdfast.LockOption) (holdfast.Locker, func()) {
			s := newSession(t, a.Client(t), WithTTL(conformanceTTL), WithLockDelay(0))
			m, err := NewMutex(s, name, opts...)
			if err != nil {
				t.Fatalf("NewMutex(%q): %v", name, err)
			}
			return holdfast.AsLocker[*Grant](m), func() { destroy(t, admin, s.ID()) }
		},
		Keys: func(t *testing.T, name string) []string { return keys(t, admin, name) },
		// A destroyed session is noticed through the session watch within
		// milliseconds (TestSessionDestroyedNoticed asserts < 100 ms); the
		// renewals alone would take up to TTL/3 (3.3 s), so this bound
		// fails without the watch.
		LossNotice: time.Second,
	})
}
