package etcd_test

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

var deadWaiterTTL = flag.Duration("deadwaiter.ttl", etcd.MinTTL, "session TTL of TestDeadWaiterCost (the README's figure: 5s)")

// TestDeadWaiterCost: a waiter in the middle of the FIFO queue dies (its
// connection blackholed: kill -9 of its process, as far as etcd can tell;
// its lease is no longer renewed). The holder releases; the waiter behind
// the dead one waits for the dead one's lease to expire, and is granted
// within TTL + 1 s of the release (README, "Guarantees").
func TestDeadWaiterCost(t *testing.T) {
	ttl := *deadWaiterTTL
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	h := newMutex(t, newSession(t, c, etcd.WithTTL(ttl)), "deadwaiter")
	ds, dp := proxiedSession(t, c, etcd.WithTTL(ttl))
	d := newMutex(t, ds, "deadwaiter")
	w := newMutex(t, newSession(t, c, etcd.WithTTL(ttl)), "deadwaiter")
	g, err := h.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dead := make(chan error, 1)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 3*ttl)
		defer cancel()
		_, err := d.Lock(dctx)
		dead <- err
	}()
	waitFor(t, 5*time.Second, "the dead waiter's key", func() bool { return len(keys(t, c.Client(t), "deadwaiter/")) == 2 })
	got := make(chan time.Time, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 3*ttl)
		defer cancel()
		if g, err := w.Lock(wctx); err == nil {
			got <- time.Now()
			_ = g.Unlock(ctx)
		} else {
			t.Error(err)
			close(got)
		}
	}()
	waitFor(t, 5*time.Second, "the live waiter's key", func() bool { return len(keys(t, c.Client(t), "deadwaiter/")) == 3 })
	dp.Blackhole() // kill -9
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	at, ok := <-got
	if !ok {
		return
	}
	wait := at.Sub(released)
	t.Logf("TTL %v: the waiter behind the dead one was granted %v after the release", ttl, wait.Round(time.Millisecond))
	if wait > ttl+time.Second {
		t.Errorf("granted %v after the release, want within TTL + 1 s (%v)", wait, ttl+time.Second)
	}
	dp.Mend()
	if err := <-dead; err == nil {
		t.Error("the dead waiter was granted")
	}
}
