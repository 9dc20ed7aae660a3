package conformance

import (
	"time"

	"github.com/holdfast/holdfast"
)

// testLiveness: a live waiter is granted within admitWithin once the lock
// is free, even when a waiter ahead of it gave up meanwhile. A holds; W1,
// Q and W2 queue in that order; Q's Lock is cancelled while it waits; A
// releases: W1 must be granted within admitWithin; W1 releases: W2 must be
// granted within admitWithin, with nothing of Q's in its way. The same
// runs with a semaphore of limit 1 and with a read-write lock's writers,
// when the backend has them. (The soak's liveness checker measures the
// same free-while-waiting intervals under faults: docs/SAFETY.md.)
func testLiveness(s *suite) {
	s.liveness("lock", func() holdfast.Locker { return s.locker() })
	if s.b.NewSemaphore != nil {
		s.liveness("semaphore of limit 1", func() holdfast.Locker {
			l, f := s.b.NewSemaphore(s.t, s.name+"-sem", 1)
			s.faults(f, "NewSemaphore")
			return l
		})
	}
	if s.b.NewRWMutex != nil {
		s.liveness("read-write lock's writers", func() holdfast.Locker {
			l, f := s.b.NewRWMutex(s.t, s.name+"-rw")
			s.faults(f, "NewRWMutex")
			return l
		})
	}
}

// liveness runs testLiveness's scenario on the lockers newLocker makes
// (each on a session of its own, all of one lock).
func (s *suite) liveness(what string, newLocker func() holdfast.Locker) {
	s.t.Helper()
	a, w1, q, w2 := newLocker(), newLocker(), newLocker(), newLocker()
	ga := s.lock(a, what+": A")
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	r1 := start(ctx, w1, false)
	time.Sleep(100 * time.Millisecond) // W1 queues first
	qctx, qcancel := s.ctx(s.op)
	rq := start(qctx, q, false)
	time.Sleep(100 * time.Millisecond)
	r2 := start(ctx, w2, false)
	time.Sleep(100 * time.Millisecond)
	qcancel()
	if r := s.await(rq, slack, what+": Q's cancelled Lock"); r.err == nil {
		s.track(r.g)
		s.t.Fatalf("%s: Q was granted the lock while A held it", what)
	}
	// W1 and W2 in whichever order the store queued them: each must be
	// granted within admitWithin of the previous release.
	s.unlock(ga, what+": A")
	freed := time.Now()
	pending := map[string]<-chan result{"W1": r1, "W2": r2}
	for len(pending) > 0 {
		var who string
		var r result
		select {
		case r = <-pending["W1"]:
			who = "W1"
		case r = <-pending["W2"]:
			who = "W2"
		case <-time.After(s.op + slack):
			s.t.Fatalf("%s: waiters %v not granted within %v of the last release", what, len(pending), s.op+slack)
		}
		delete(pending, who)
		if r.err != nil {
			s.t.Fatalf("%s: %s: Lock: %v", what, who, r.err)
		}
		s.track(r.g)
		if d := r.at.Sub(freed); d > admitWithin {
			s.t.Errorf("%s: %s granted %v after the lock was released (Q, queued beside it, gave up), want within %v", what, who, d.Round(time.Millisecond), admitWithin)
		}
		s.unlock(r.g, what+": "+who)
		freed = time.Now()
	}
}
