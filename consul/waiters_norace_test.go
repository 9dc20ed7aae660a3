//go:build !race

package consul

import "testing"

// TestWaitersCostFlat512: the requests and response bytes per acquisition
// with 512 waiters on one lock are within 10% of those with 2 (measured in
// the same run). Every request of every contender is counted, blocking
// queries and the sessions' own included; no timing is asserted. Without
// -race (make test's second line): 513 sessions under -race take minutes.
func TestWaitersCostFlat512(t *testing.T) {
	small := measureWaiters(t, 2, 300)
	large := measureWaiters(t, 512, 1024)
	t.Log(small)
	t.Log(large)
	if r := large.requests / small.requests; r > 1.1 || r < 1/1.1 {
		t.Errorf("requests per acquisition: %.2f with 512 waiters, %.2f with 2 (ratio %.3f), want within 10%%", large.requests, small.requests, r)
	}
	if r := large.bytes / small.bytes; r > 1.1 || r < 1/1.1 {
		t.Errorf("response bytes per acquisition: %.0f with 512 waiters, %.0f with 2 (ratio %.3f), want within 10%%", large.bytes, small.bytes, r)
	}
}
