package consul

import (
	"testing"
	"time"
)

// TestHandoffOneWriteOneNotification (issue 18): a handoff is one write and
// one notification. w2 queues behind w1 before w1 is granted the lock: the
// answer that tells w1 it holds carries w2's link, so w1's Unlock is one
// request (the handoff), and w2, whose blocking query is already on its
// way, holds the lock with no further request, with the handoff write's
// index as its token. (Before the linked queue, w2 announced itself in the
// lock key once it saw w1 holding, and w1's Unlock read the key first: 2
// requests.)
func TestHandoffOneWriteOneNotification(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	x := newMutex(t, newSession(t, c, WithLockDelay(0), WithTTL(time.Hour)), name)
	c1, cnt1 := countingClient(t, a)
	c2, cnt2 := countingClient(t, a)
	w1 := newMutex(t, newSession(t, c1, WithLockDelay(0), WithTTL(time.Hour)), name)
	w2 := newMutex(t, newSession(t, c2, WithLockDelay(0), WithTTL(time.Hour)), name)
	gx, err := x.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r1 := queueUp(t, c, w1, timeout(t, 10*time.Second))
	r2 := queueUp(t, c, w2, timeout(t, 10*time.Second))
	time.Sleep(100 * time.Millisecond) // both settled in their blocking queries
	if err := gx.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	g1 := receive(t, r1, 5*time.Second, "w1")
	if g1.err != nil {
		t.Fatal(g1.err)
	}
	time.Sleep(100 * time.Millisecond) // w2's blocking query on its way again
	n1, n2 := cnt1.n.Load(), cnt2.n.Load()
	if err := g1.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	g2 := receive(t, r2, 5*time.Second, "w2")
	if g2.err != nil {
		t.Fatal(g2.err)
	}
	if d := cnt1.n.Load() - n1; d != 1 {
		t.Errorf("w1's Unlock made %d requests, want 1 (the handoff)", d)
	}
	if d := cnt2.n.Load() - n2; d != 0 {
		t.Errorf("w2 made %d requests between w1's Unlock and its grant, want 0 (the answer of its blocking query)", d)
	}
	if pair := lockKeyNow(t, c, name); pair == nil || pair.Session != w2.s.id || pair.ModifyIndex != uint64(g2.g.Token()) {
		t.Errorf("lock key %+v, want held by w2's session at its token %d", pair, g2.g.Token())
	}
	if err := g2.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}
