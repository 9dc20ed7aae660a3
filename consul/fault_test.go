package consul

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// onTime is how late a call may return after its context ended, with Consul
// frozen.
const onTime = 100 * time.Millisecond

// elapsed runs f and returns how long it took.
func elapsed(f func()) time.Duration {
	t0 := time.Now()
	f()
	return time.Since(t0)
}

// TestFrozenLockOnTime (defect 3): with Consul frozen (the proxy holds every
// byte, as a SIGSTOPped agent would), Lock and TryLock with a 2 s deadline
// return within 2 s + 100 ms, and so does a Lock that queued before the
// freeze. Once Consul is back, what that Lock left (its queue key) is
// removed within cleanupBound while the session lives, and the session can
// lock the name again.
func TestFrozenLockOnTime(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	hg, err := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p, pc := proxied(t, a)
	s := newSession(t, pc, WithLockDelay(0))
	m := newMutex(t, s, name)

	// Queued, then frozen.
	const wait = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	t0 := time.Now()
	res := queueUp(t, admin, m, ctx)
	p.Pause()
	r := receive(t, res, wait+time.Second, "queued Lock")
	if d := time.Since(t0); !errors.Is(r.err, context.DeadlineExceeded) || d > wait+onTime {
		t.Errorf("queued Lock, Consul frozen: %v after %v; want DeadlineExceeded within %v", r.err, d, wait+onTime)
	}
	// Frozen before the call (other names: this one is being cleaned up).
	for _, try := range []bool{false, true} {
		var err error
		fresh := newMutex(t, s, uniqueName(t))
		d := elapsed(func() {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if try {
				_, err = fresh.TryLock(ctx)
			} else {
				_, err = fresh.Lock(ctx)
			}
		})
		t.Logf("try=%v, Consul frozen: returned %v after %v", try, err, d)
		if d > wait+onTime || err == nil {
			t.Errorf("try=%v, Consul frozen: %v after %v; want an error within %v", try, err, d, wait+onTime)
		}
	}
	qkey := m.queueKey()
	if !slices.Contains(keys(t, admin, name), qkey) {
		t.Fatal("the queue key is gone although Consul was frozen: the test proves nothing")
	}
	t1 := time.Now()
	p.Mend()
	waitFor(t, cleanupBound, "queue key removed once Consul is back", func() bool { return !slices.Contains(keys(t, admin, name), qkey) })
	t.Logf("queue key removed %v after Consul was back", time.Since(t1))
	if err := hg.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	g, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Lock through the same session after the cleanup: %v", err)
	}
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if s.Err() != nil {
		t.Errorf("session ended: %v", s.Err())
	}
}

// TestFrozenUnlockOnTime (defects 1 and 2): with Consul frozen, a guarded
// Txn and Unlock return when their contexts end; the grant ends locally at
// once; once Consul is back, the session frees the key in the background and
// can lock the name again.
func TestFrozenUnlockOnTime(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	p, pc := proxied(t, a)
	s := newSession(t, pc, WithLockDelay(0))
	m := newMutex(t, s, name)
	g, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p.Pause()
	const wait = time.Second
	var txnErr, unlockErr error
	d := elapsed(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_, txnErr = g.Txn(ctx, api.TxnOps{setOp(name+"-data", "x")})
	})
	if d > wait+onTime || !errors.Is(txnErr, context.DeadlineExceeded) {
		t.Errorf("Txn, Consul frozen: %v after %v; want DeadlineExceeded within %v", txnErr, d, wait+onTime)
	}
	d = elapsed(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		unlockErr = g.Unlock(ctx)
	})
	t.Logf("Unlock, Consul frozen: %v after %v", unlockErr, d)
	if d > wait+onTime || !errors.Is(unlockErr, context.DeadlineExceeded) {
		t.Errorf("Unlock, Consul frozen: %v after %v; want DeadlineExceeded within %v", unlockErr, d, wait+onTime)
	}
	if cause := context.Cause(g.Context()); !errors.Is(cause, holdfast.ErrReleased) {
		t.Errorf("grant cause after Unlock: %v, want ErrReleased", cause)
	}
	if pair := lockKeyNow(t, admin, name); pair == nil || pair.Session != s.ID() {
		t.Fatalf("lock key %+v, want still held while Consul is frozen: the test proves nothing", pair)
	}
	t1 := time.Now()
	p.Mend()
	waitFor(t, cleanupBound, "key freed once Consul is back", func() bool { return lockKeyNow(t, admin, name) == nil })
	t.Logf("key freed %v after Consul was back", time.Since(t1))
	g2, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Lock through the same session: %v", err)
	}
	if err := g2.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	_, _ = admin.KV().Delete(name+"-data", nil)
}

// TestUnlockCancelledContext (defect 2): Unlock with a cancelled context
// returns its error, and the key is freed all the same, so that another
// session gets the lock and this one can lock the name again.
func TestUnlockCancelledContext(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	s := newSession(t, a.Client(t), WithLockDelay(0))
	m := newMutex(t, s, name)
	g, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Unlock(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Unlock(cancelled): %v, want context.Canceled", err)
	}
	waitFor(t, time.Second, "key freed after Unlock(cancelled)", func() bool { return lockKeyNow(t, admin, name) == nil })
	og, err := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name).TryLock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("another session's TryLock: %v", err)
	}
	if err := og.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	g2, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Lock again through the same session: %v", err)
	}
	if err := g2.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestGrantContextAtDeadline (item 9): with renewals blocked, the grant's
// context is done at the first check once time.Now() has passed
// g.Deadline(), before any timer could have fired.
func TestGrantContextAtDeadline(t *testing.T) {
	t.Parallel()
	a := agent(t)
	p, pc := proxied(t, a)
	s := newSession(t, pc, WithTTL(MinTTL), WithLockDelay(0))
	g, err := newMutex(t, s, uniqueName(t)).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p.Pause()
	defer p.Mend()
	deadline := g.Deadline()
	if d := time.Until(deadline); d <= 0 || d > MinTTL {
		t.Fatalf("deadline %v from now, want within the TTL", d)
	}
	for !time.Now().After(deadline) {
		if g.Context().Err() != nil {
			t.Fatalf("grant context done %v before its deadline: %v", time.Until(deadline), context.Cause(g.Context()))
		}
		time.Sleep(time.Until(deadline) / 2)
	}
	if g.Context().Err() == nil {
		t.Fatal("grant context live at the first check after its deadline")
	}
	if cause := context.Cause(g.Context()); !errors.Is(cause, holdfast.ErrSessionLost) {
		t.Errorf("cause: %v, want ErrSessionLost", cause)
	}
}
