package safety

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
)

// TestConsulDevAgentRestart: a dev agent restarted loses every session and
// key. The holder must notice and stop acting as holder (its grant context
// ends with ErrSessionLost), and a waiter's Lock fails the same way, within
// a renewal period or two. New sessions then lock again, with tokens that
// start over from the new agent's index: the fence refuses them while it
// remembers a higher token (safe, but a fenced resource needs its tokens
// reset, or an epoch, after a store loses its state; docs/SAFETY.md).
func TestConsulDevAgentRestart(t *testing.T) {
	a := embedtest.Consul(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	open := func() *consul.Mutex {
		s, err := consul.Dial(ctx, a.HTTPAddr, consul.WithTTL(consul.MinTTL), consul.WithLockDelay(0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		m, err := consul.NewMutex(s, "safety/restart")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	res := NewResource()
	// Raise the index a little, so that the token regression is visible.
	for range 20 {
		m := open()
		g, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = g.Unlock(ctx)
	}
	g1, err := open().Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Write(1, g1.Token()); err != nil {
		t.Fatal(err)
	}
	waiter := make(chan error, 1)
	go func() { _, err := open().Lock(ctx); waiter <- err }()
	time.Sleep(300 * time.Millisecond)

	restarted := time.Now()
	if err := a.Restart(); err != nil {
		t.Fatal(err)
	}
	bound := consul.MinTTL + 5*time.Second // a renewal (every TTL/3) answers 404
	select {
	case <-g1.Context().Done():
		t.Logf("holder told %v after the restart began: %v", time.Since(restarted).Round(time.Millisecond), context.Cause(g1.Context()))
		if !errors.Is(context.Cause(g1.Context()), holdfast.ErrSessionLost) {
			t.Errorf("holder's cause: %v, want ErrSessionLost", context.Cause(g1.Context()))
		}
	case <-time.After(bound):
		t.Fatalf("the holder still acts as holder %v after its agent lost its state", bound)
	}
	select {
	case err := <-waiter:
		if !errors.Is(err, holdfast.ErrSessionLost) {
			t.Errorf("waiter's Lock: %v, want ErrSessionLost", err)
		}
	case <-time.After(bound):
		t.Fatal("the waiter still waits on a session its agent forgot")
	}
	g3, err := open().Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer g3.Unlock(ctx)
	err = res.Write(3, g3.Token())
	t.Logf("before the restart token %d; after it %d; the fence: %v", g1.Token(), g3.Token(), err)
	if g3.Token() < g1.Token() && !errors.Is(err, holdfast.ErrStaleToken) {
		t.Errorf("the fence accepted token %d after %d", g3.Token(), g1.Token())
	}
	if bad := CheckFence(res.Writes()); len(bad) > 0 {
		t.Error(bad)
	}
}
