//go:build holdfast_testhooks || holdfast_mutants

package consul

import (
	"errors"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
)

// TestSemaphoreStaleTryLock: an admission made from a stale read is refused
// by the lock key's CAS (guard consul/permit-cas): two TryLocks that both
// read a free permit of a limit-1 semaphore cannot both get it.
func TestSemaphoreStaleTryLock(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 20*time.Second)
	first := newSemaphore(t, newSession(t, c), name, 1)
	second := newSemaphore(t, newSession(t, c), name, 1)
	var g2 *Grant
	nop := hookTryRead
	defer func() { hookTryRead = nop }()
	hookTryRead = func(p *permits) {
		if p != first.p {
			return
		}
		var err error
		if g2, err = second.TryLock(ctx); err != nil { // between first's read and write
			t.Error(err)
		}
	}
	g1, err := first.TryLock(ctx)
	hookTryRead = nop
	if g2 == nil {
		t.FailNow()
	}
	if err == nil {
		_ = g1.Unlock(ctx)
		t.Fatalf("two permits of a limit-1 semaphore: tokens %d and %d", g1.Token(), g2.Token())
	}
	if !errors.Is(err, holdfast.ErrLocked) {
		t.Fatalf("stale TryLock: %v, want ErrLocked", err)
	}
	if l := semLock(t, c, name); len(l.Holders) != 1 {
		t.Fatalf("holders %v", l.Holders)
	}
	_ = g2.Unlock(ctx)
}

// TestSemaphoreReleaseGuard: a release whose key was deleted from outside
// between its read and its write applies nothing and reports ErrNotHeld
// (guard consul/permit-release-check-session).
func TestSemaphoreReleaseGuard(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 20*time.Second)
	g, err := newSemaphore(t, newSession(t, c), name, 2).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nop := hookLeaveRead
	defer func() { hookLeaveRead = nop }()
	hookLeaveRead = func(p *permits) {
		if _, err := c.KV().Delete(g.Key(), nil); err != nil {
			t.Error(err)
		}
	}
	if err := g.Unlock(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("Unlock after the key was deleted from outside: %v, want ErrNotHeld", err)
	}
}
