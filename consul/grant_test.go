package consul

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// checkTTL is the session TTL of the tests of the held-key check: renewals,
// each followed by the check, every TTL/3.
const checkTTL = 10 * time.Second

// lostWithin waits up to d for g's context to end and returns how long it
// took.
func lostWithin(t *testing.T, g *Grant, d time.Duration, what string) time.Duration {
	t.Helper()
	t0 := time.Now()
	select {
	case <-g.Context().Done():
		return time.Since(t0)
	case <-time.After(d):
		t.Fatalf("%s: grant context still live %v later", what, d)
		return 0
	}
}

// TestKeyTakenOverNoticed (defect 4): the lock key is deleted from outside
// and another session takes the lock. The first grant ends within TTL/3
// (plus slack) with a cause wrapping ErrLost, its Unlock returns ErrNotHeld
// at once, and its background release leaves the new holder's key alone.
func TestKeyTakenOverNoticed(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	g, err := newMutex(t, newSession(t, a.Client(t), WithTTL(checkTTL), WithLockDelay(0)), name).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.KV().Delete(g.Key(), nil); err != nil {
		t.Fatal(err)
	}
	other := newSession(t, a.Client(t), WithLockDelay(0))
	og, err := newMutex(t, other, name).TryLock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("TryLock after the delete: %v", err)
	}
	took := lostWithin(t, g, checkTTL/3+time.Second, "after the key was taken over")
	t.Logf("key deleted and taken over: the old grant ended %v later (TTL %v: checks every %v)", took, checkTTL, checkTTL/3)
	if cause := context.Cause(g.Context()); !errors.Is(cause, holdfast.ErrLost) || !strings.Contains(cause.Error(), "taken over") && !strings.Contains(cause.Error(), "deleted") {
		t.Errorf("cause: %v, want ErrLost saying why", cause)
	}
	t0 := time.Now()
	if err := g.Unlock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Unlock of the lost grant: %v, want ErrNotHeld", err)
	}
	if d := time.Since(t0); d > 50*time.Millisecond {
		t.Errorf("Unlock of a lost grant took %v, want at once", d)
	}
	select {
	case <-g.base.Finished():
	case <-time.After(5 * time.Second):
		t.Fatal("the lost grant's release did not finish")
	}
	if pair := lockKeyNow(t, admin, name); pair == nil || pair.Session != other.ID() {
		t.Errorf("lock key after the lost grant's release: %+v, want still held by the new holder %s", pair, other.ID())
	}
	if err := og.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestKeyDeletedNoticed (defect 4): a lock key deleted by an operator ends
// the grant within TTL/3 (plus slack), even when nobody takes the lock.
func TestKeyDeletedNoticed(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	g, err := newMutex(t, newSession(t, a.Client(t), WithTTL(checkTTL), WithLockDelay(0)), name).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.KV().Delete(g.Key(), nil); err != nil {
		t.Fatal(err)
	}
	took := lostWithin(t, g, checkTTL/3+time.Second, "after the key was deleted")
	t.Logf("key deleted: grant ended %v later", took)
	if cause := context.Cause(g.Context()); !errors.Is(cause, holdfast.ErrLost) || !strings.Contains(cause.Error(), "deleted") {
		t.Errorf("cause: %v, want ErrLost saying the key was deleted", cause)
	}
}

// TestStaleUnlockSameSession: a grant lost to an operator's delete, then the
// name locked again through the same Mutex: the old grant's Unlock returns
// ErrNotHeld and the new grant's key stays held.
func TestStaleUnlockSameSession(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	s := newSession(t, a.Client(t), WithTTL(checkTTL), WithLockDelay(0))
	m := newMutex(t, s, name)
	g1, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.KV().Delete(g1.Key(), nil); err != nil {
		t.Fatal(err)
	}
	lostWithin(t, g1, checkTTL/3+time.Second, "after the key was deleted")
	g2, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := g1.Unlock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("stale Unlock: %v, want ErrNotHeld", err)
	}
	time.Sleep(100 * time.Millisecond)
	if pair := lockKeyNow(t, admin, name); pair == nil || pair.Session != s.ID() || tokenOf(pair) != uint64(g2.Token()) {
		t.Errorf("lock key after the stale Unlock: %+v, want held by the new grant (token %d)", pair, g2.Token())
	}
	if g2.Context().Err() != nil {
		t.Errorf("new grant ended: %v", context.Cause(g2.Context()))
	}
	if err := g2.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestPokedKeyStillHeld (defect 11): a write to the lock key that keeps our
// session (Consul's lock tests' poke: KV().Put with a new value, same flags)
// does not end the grant: guarded writes still apply, the held-key check
// keeps it, and Unlock frees the key.
func TestPokedKeyStillHeld(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	data := name + "-data"
	t.Cleanup(func() { _, _ = admin.KV().Delete(data, nil) })
	s := newSession(t, a.Client(t), WithLockDelay(0))
	g, err := newMutex(t, s, name).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	pair := lockKeyNow(t, admin, name)
	pair.Value = []byte("poked")
	if _, err := admin.KV().Put(pair, nil); err != nil {
		t.Fatal(err)
	}
	if after := lockKeyNow(t, admin, name); after.Session != s.ID() || after.ModifyIndex == pair.ModifyIndex {
		t.Fatalf("after the poke: %+v; want our session, a new index", after)
	}
	s.checkKeys(context.Background(), 5*time.Second)
	if g.Context().Err() != nil {
		t.Fatalf("grant ended by a poke: %v", context.Cause(g.Context()))
	}
	if _, err := g.Txn(timeout(t, 5*time.Second), api.TxnOps{setOp(data, "v")}); err != nil {
		t.Errorf("Txn after a poke: %v", err)
	}
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Errorf("Unlock after a poke: %v", err)
	}
	if pair := lockKeyNow(t, admin, name); pair != nil {
		t.Errorf("lock key after Unlock: %+v, want gone", pair)
	}
}

// TestHandoffToLateWaiter (defect 10): the holder took the lock when nobody
// waited; then a holdfast waiter queues, then an api.Lock client waits too.
// Unlock hands the lock to the holdfast waiter, in 4 of 4 trials. To make
// the race decisive, the holdfast waiter's own traffic is frozen while the
// holder unlocks: only a handoff by the holder can give it the lock first.
func TestHandoffToLateWaiter(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	for trial := range 4 {
		name := uniqueName(t)
		p, pc := proxied(t, a)
		h := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)
		w := newMutex(t, newSession(t, pc, WithLockDelay(0)), name)
		g, err := h.Lock(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		wres := queueUp(t, c, w, timeout(t, 10*time.Second))
		time.Sleep(100 * time.Millisecond) // the waiter is at the head, watching
		l, err := c.LockOpts(&api.LockOptions{Key: LockKey(name), LockWaitTime: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		native := make(chan error, 1)
		go func() {
			lost, err := l.Lock(stop)
			if err == nil && lost != nil {
				err = l.Unlock()
			}
			native <- err
		}()
		time.Sleep(200 * time.Millisecond) // api.Lock is waiting on the key
		p.Pause()
		if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if pair := lockKeyNow(t, c, name); pair == nil || pair.Session != w.s.id {
			t.Errorf("trial %d: lock key %+v after Unlock, want handed to the holdfast waiter's session %s", trial, pair, w.s.id)
		}
		p.Mend()
		r := receive(t, wres, 5*time.Second, "holdfast waiter")
		if r.err != nil {
			t.Fatalf("trial %d: holdfast waiter: %v", trial, r.err)
		}
		if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-native:
			if err != nil {
				t.Errorf("api.Lock: %v", err)
			}
		case <-time.After(10 * time.Second):
			close(stop)
			t.Fatal("api.Lock did not get the lock after the holdfast waiter released it")
		}
	}
}

// TestTxnOwnKeys (defect 5): Grant.Txn refuses operations on the lock's own
// keys, and deletes of a tree holding them, before any request.
func TestTxnOwnKeys(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c, cnt := countingClient(t, a)
	name := uniqueName(t)
	g, err := newMutex(t, newSession(t, c, WithLockDelay(0)), name).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := timeout(t, 5*time.Second)
	bad := []*api.TxnOp{
		setOp(LockKey(name), "x"),
		setOp(name+queueInfix+"someone", "x"),
		setOp(name+"/other", "x"),
		kvOp(api.KVDelete, LockKey(name)),
		kvOp(api.KVGet, LockKey(name)),
		kvOp(api.KVDeleteTree, name),
		kvOp(api.KVDeleteTree, "test/"),
		kvOp(api.KVDeleteTree, ""),
	}
	n0 := cnt.n.Load()
	for _, op := range bad {
		if _, err := g.Txn(ctx, api.TxnOps{setOp(name+"-data", "ok"), op}); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("Txn with %s %q: %v, want ErrInvalidArgument", op.KV.Verb, op.KV.Key, err)
		}
	}
	if n := cnt.n.Load() - n0; n != 0 {
		t.Errorf("%d requests sent for refused transactions, want 0", n)
	}
	if pair := lockKeyNow(t, c, name); pair == nil || pair.Flags != api.LockFlagValue {
		t.Errorf("lock key %+v, want intact", pair)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNestedNames: a lock on "a" fails with ErrConflict while a lock on
// "a/b" is held, writes nothing, and leaves "a/b" alone.
func TestNestedNames(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	outer := uniqueName(t)
	inner := outer + "/b"
	s := newSession(t, c, WithLockDelay(0))
	gi, err := newMutex(t, s, inner).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	before := keys(t, c, outer)
	other := newSession(t, a.Client(t), WithLockDelay(0))
	for _, m := range []*Mutex{newMutex(t, s, outer), newMutex(t, other, outer)} {
		if _, err := m.Lock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrConflict) {
			t.Errorf("Lock(%q) with %q held: %v, want ErrConflict", outer, inner, err)
		} else {
			t.Log(err)
		}
		if _, err := m.TryLock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrConflict) {
			t.Errorf("TryLock(%q) with %q held: %v, want ErrConflict", outer, inner, err)
		}
	}
	if after := keys(t, c, outer); !slices.Equal(before, after) {
		t.Errorf("keys under %s/: %q, want %q", outer, after, before)
	}
	if gi.Context().Err() != nil {
		t.Errorf("inner grant ended: %v", context.Cause(gi.Context()))
	}
	if err := gi.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	go_, err := newMutex(t, s, outer).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Lock(%q) once nothing is under it: %v", outer, err)
	}
	if err := go_.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}
