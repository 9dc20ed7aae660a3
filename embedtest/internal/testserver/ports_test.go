package testserver

import "testing"

// TestPortsBelowEphemeralRange: ports handed out are never in the range the
// kernel uses for outgoing connections, so a stopped member's port cannot be
// taken by a client connection before it restarts.
func TestPortsBelowEphemeralRange(t *testing.T) {
	lo := EphemeralLow()
	ps, err := FreePorts(50, true)
	if err != nil {
		t.Fatal(err)
	}
	defer ReleasePorts(ps)
	seen := map[int]bool{}
	for _, p := range ps {
		if p < PortRangeLow || p >= lo {
			t.Errorf("port %d outside [%d, %d)", p, PortRangeLow, lo)
		}
		if seen[p] {
			t.Errorf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
