package consul

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/leakcheck"
)

// TestClose: Close cancels grants and waiters with ErrSessionClosed, gives
// the held keys back (so no lock-delay applies), destroys the session, and
// later use fails with ErrSessionClosed.
func TestClose(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	held, waited := uniqueName(t)+"-held", uniqueName(t)+"-waited"

	s := newSession(t, a.Client(t)) // default lock-delay: 15 s
	g, err := newMutex(t, s, held).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	og, err := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), waited).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	wm := newMutex(t, s, waited)
	res := make(chan error, 1)
	go func() {
		_, err := wm.Lock(timeout(t, 30*time.Second))
		res <- err
	}()
	waitFor(t, 5*time.Second, "waiter queued", func() bool { return len(keys(t, admin, waited)) == 2 })

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	cause := context.Cause(g.Context())
	if !errors.Is(cause, holdfast.ErrLost) || !errors.Is(cause, holdfast.ErrSessionClosed) {
		t.Errorf("grant cause after Close: %v, want ErrLost and ErrSessionClosed", cause)
	}
	if err := <-res; !errors.Is(err, holdfast.ErrSessionClosed) {
		t.Errorf("waiter after Close: %v, want ErrSessionClosed", err)
	}
	if ks := keys(t, admin, held); len(ks) != 0 {
		t.Errorf("keys of the held lock after Close: %q", ks)
	}
	if ks := keys(t, admin, waited); len(ks) != 1 {
		t.Errorf("keys of the waited lock after Close: %q, want the other holder's only", ks)
	}
	if info, _, err := admin.Session().Info(s.ID(), nil); err != nil || info != nil {
		t.Errorf("session after Close: %+v, %v; want none", info, err)
	}
	if !errors.Is(s.Err(), holdfast.ErrSessionClosed) || s.Context().Err() == nil {
		t.Errorf("Err after Close: %v", s.Err())
	}
	// Released, not invalidated: no lock-delay for the next holder.
	start := time.Now()
	ng, err := newMutex(t, newSession(t, a.Client(t)), held).TryLock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("TryLock right after Close released the lock: %v", err)
	}
	t.Logf("next holder in %v", time.Since(start))

	if _, err := NewMutex(s, held); !errors.Is(err, holdfast.ErrSessionClosed) {
		t.Errorf("NewMutex after Close: %v", err)
	}
	if _, err := wm.Lock(timeout(t, time.Second)); !errors.Is(err, holdfast.ErrSessionClosed) {
		t.Errorf("Lock after Close: %v", err)
	}
	if err := g.Unlock(timeout(t, time.Second)); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Unlock after Close: %v, want ErrNotHeld", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for _, g := range []interface{ Unlock(context.Context) error }{ng, og} {
		if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Error(err)
		}
	}
}

// TestNoGoroutineLeak: after Close, nothing of the session runs.
func TestNoGoroutineLeak(t *testing.T) {
	a := agent(t) // before the check: the shared agent outlives the test
	leakcheck.Check(t)
	c := a.Client(t)
	name := uniqueName(t)
	s, err := NewSession(timeout(t, 5*time.Second), c, WithLockDelay(0))
	if err != nil {
		t.Fatal(err)
	}
	o, err := NewSession(timeout(t, 5*time.Second), c, WithLockDelay(0))
	if err != nil {
		t.Fatal(err)
	}
	g, err := newMutex(t, s, name).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := newMutex(t, o, name).Lock(ctx); !isCtx(err) {
		t.Errorf("waiter: %v, want a context error", err)
	}
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := newMutex(t, o, name+"/held").Lock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
}
