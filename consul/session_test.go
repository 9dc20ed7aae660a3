package consul

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/leakcheck"
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
	waitFor(t, 5*time.Second, "waiter queued", func() bool { return queueLen(t, admin, waited) == 1 })

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
	if ks := keys(t, admin, waited); len(ks) != 4 || slices.ContainsFunc(ks, func(k string) bool { return strings.Contains(k, s.ID()) }) {
		t.Errorf("keys of the waited lock after Close: %q, want the other holder's only (lock key, entry, held mark, tail key)", ks)
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

// TestSessionDestroyedNoticed: a session destroyed in Consul ends its grants
// in under 100 ms (through the blocking query on the session; renewals
// alone would take up to TTL/3), in each of 3 trials.
func TestSessionDestroyedNoticed(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	for trial := range 3 {
		s := newSession(t, a.Client(t), WithLockDelay(0))
		g, err := newMutex(t, s, uniqueName(t)).Lock(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // the watch's blocking query is in place
		t0 := time.Now()
		destroy(t, admin, s.ID())
		select {
		case <-g.Context().Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("trial %d: grant live 5 s after its session was destroyed", trial)
		}
		d := time.Since(t0)
		t.Logf("trial %d: destroyed session noticed in %v", trial, d)
		if d > 100*time.Millisecond {
			t.Errorf("trial %d: destroyed session noticed in %v, want < 100 ms", trial, d)
		}
		if cause := context.Cause(g.Context()); !errors.Is(cause, holdfast.ErrSessionLost) {
			t.Errorf("trial %d: cause %v, want ErrSessionLost", trial, cause)
		}
	}
}

// TestMemoryPerGrant: 1,000 grants held through one session cost no
// goroutine and at most 2 KiB each on the client (heap after GC, Mutex and
// Grant together).
func TestMemoryPerGrant(t *testing.T) {
	// Not parallel: it measures the process's heap.
	a := agent(t)
	c := a.Client(t)
	s := newSession(t, c, WithLockDelay(0), WithTTL(time.Hour))
	base := uniqueName(t)
	const n = 1000
	names := make([]string, n)
	for i := range names {
		names[i] = base + "/" + strconv.Itoa(i)
	}
	// Warm up: connection pool, caches.
	g, err := newMutex(t, s, base+"-warm").Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	ctx := timeout(t, time.Minute) // one context: each timeout(t, ...) stays until the test ends
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	grants := make([]*Grant, n)
	for i, name := range names {
		m, err := NewMutex(s, name)
		if err != nil {
			t.Fatal(err)
		}
		if grants[i], err = m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	g1 := runtime.NumGoroutine()
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	t.Logf("%d grants on one session: %.0f bytes of heap per grant (Mutex + Grant), %d goroutines more", n, per, g1-g0)
	if per > 2048 {
		t.Errorf("%.0f bytes per grant, want at most 2048", per)
	}
	if g1-g0 > 2 { // an HTTP connection of the pool may come or go
		t.Errorf("%d goroutines more for %d grants, want none per grant", g1-g0, n)
	}
	s.checkKeys(context.Background(), 10*time.Second) // 16 transactions of 64 reads
	for i, g := range grants {
		if g.Context().Err() != nil {
			t.Fatalf("grant %d ended by the key check: %v", i, context.Cause(g.Context()))
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDial: Dial opens a session on a client of its own, and Close closes
// its connections; an unreachable agent is reported at once.
func TestDial(t *testing.T) {
	t.Parallel()
	a := agent(t)
	s, err := Dial(timeout(t, 5*time.Second), a.HTTPAddr, WithLockDelay(0))
	if err != nil {
		t.Fatal(err)
	}
	if s.Client() == nil || s.TTL() != defaultTTL || s.cfg.lockDelay != 0 {
		t.Errorf("Dial's session: client %v, TTL %v, lock-delay %v; want a client, %v, 0", s.Client(), s.TTL(), s.cfg.lockDelay, defaultTTL)
	}
	name := uniqueName(t)
	m := newMutex(t, s, name)
	g, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	var derr error
	d := elapsed(func() { _, derr = Dial(context.Background(), dead) })
	t.Logf("Dial of a closed port: %v after %v", derr, d)
	if derr == nil || !strings.Contains(derr.Error(), "refused") || d > time.Second {
		t.Errorf("Dial of a closed port: %v after %v; want connection refused at once", derr, d)
	}
	//lint:ignore SA1012 checks that a nil context is refused, not a panic
	if _, err := Dial(nil, a.HTTPAddr); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Dial(nil): %v", err)
	}
}

// TestLostHolderLeavesNothing: a lone holder whose session ends (destroyed
// here, as Consul invalidates an expired one) leaves no key behind once its
// Session is closed: its entry, held mark and tail key, and the lock key,
// which Behavior release (chosen here) leaves free (before, the lock key stayed, free,
// after the holder's process exited: seen with a `holdfast lock` paused past
// its session's expiry).
func TestLostHolderLeavesNothing(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	s := newSession(t, a.Client(t), WithLockDelay(0), WithBehavior(api.SessionBehaviorRelease))
	g, err := newMutex(t, s, name).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the watch's blocking query is in place
	destroy(t, admin, s.ID())
	select {
	case <-g.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("grant live 5 s after its session was destroyed")
	}
	if err := s.Close(); err != nil {
		t.Logf("Close: %v", err)
	}
	if ks := keys(t, admin, name); len(ks) != 0 {
		t.Errorf("keys left after the lost holder's Close: %q", ks)
	}
}

// TestSessionCreateAnswerLost: a session whose creation Consul applied but
// whose answer was lost is found by its unique name and taken: NewSession
// succeeds with it, no second session of that name is made, and none is
// left after Close.
func TestSessionCreateAnswerLost(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	c, ft := faultClient(t, a)
	name := uniqueName(t)
	f := ft.Inject(func(method, path string, body []byte) bool {
		return method == http.MethodPut && path == "/v1/session/create" && bytes.Contains(body, []byte(name))
	}, 1, embedtest.FaultLoseAnswer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := NewSession(ctx, c, WithSessionName(name))
	select {
	case <-f.Fired():
	default:
		t.Fatal("the fault did not fire")
	}
	if err != nil {
		t.Fatalf("NewSession with the creation's answer lost: %v", err)
	}
	named := func() []string {
		all, _, err := admin.Session().List(nil)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range all {
			if strings.HasPrefix(e.Name, name+" ") {
				ids = append(ids, e.ID)
			}
		}
		return ids
	}
	if ids := named(); len(ids) != 1 || ids[0] != s.ID() {
		t.Errorf("sessions named %s: %v, want the session's %s alone", name, ids, s.ID())
	}
	if _, err := newMutex(t, s, name+"/lock").Lock(ctx); err != nil {
		t.Errorf("Lock on the session: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if ids := named(); len(ids) != 0 {
		t.Errorf("sessions named %s after Close: %v", name, ids)
	}
}
