//go:build !race

package consul

import "testing"

// TestWaitersCostFlat512: the requests per acquisition with 512 waiters on
// one lock are within 10% of those with 2 and with 16, and the response
// bytes within 10% of those with 16 (measured in the same run). With 2
// waiters the queue is short enough that a successor often links itself
// after its predecessor was granted, and that release takes the slower path
// (a failed guarded delete, then a wait for the link: more writes, fewer
// wake-ups, about 8% fewer bytes), so bytes are compared from 16 on. Every
// request of every contender is counted, blocking queries and the sessions'
// own included; no timing is asserted. Without -race (make test's second
// line): 513 sessions under -race take minutes.
func TestWaitersCostFlat512(t *testing.T) {
	two := measureWaiters(t, 2, 300)
	sixteen := measureWaiters(t, 16, 300)
	large := measureWaiters(t, 512, 1024)
	for _, c := range []waitersCost{two, sixteen, large} {
		t.Log(c)
	}
	for _, small := range []waitersCost{two, sixteen} {
		if r := large.requests / small.requests; r > 1.1 || r < 1/1.1 {
			t.Errorf("requests per acquisition: %.2f with 512 waiters, %.2f with %d (ratio %.3f), want within 10%%", large.requests, small.requests, small.waiters, r)
		}
	}
	if r := large.bytes / sixteen.bytes; r > 1.1 || r < 1/1.1 {
		t.Errorf("response bytes per acquisition: %.0f with 512 waiters, %.0f with 16 (ratio %.3f), want within 10%%", large.bytes, sixteen.bytes, r)
	}
}
