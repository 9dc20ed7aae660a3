package consul

import (
	"bufio"
	"context"
	"errors"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
)

// TestAPILockInterop: holdfast's Mutex and a real api.Lock on the same key
// exclude each other, both ways, and hand over to each other.
func TestAPILockInterop(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	m := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	apiLock := func(tryOnce bool) *api.Lock {
		l, err := c.LockOpts(&api.LockOptions{Key: LockKey(name), LockTryOnce: tryOnce, LockWaitTime: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	// holdfast holds: api.Lock cannot get in.
	g, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if ch, err := apiLock(true).Lock(nil); err != nil || ch != nil {
		t.Fatalf("api.Lock while holdfast holds: lost channel %v, err %v; want no lock and no error", ch, err)
	}
	// A blocking api.Lock gets the lock when holdfast releases it.
	waiter := apiLock(false)
	got := make(chan time.Time, 1)
	go func() {
		if _, err := waiter.Lock(nil); err != nil {
			t.Errorf("api.Lock: %v", err)
		}
		got <- time.Now()
	}()
	time.Sleep(200 * time.Millisecond)
	released := time.Now()
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		t.Logf("api.Lock acquired %v after holdfast's Unlock", at.Sub(released))
	case <-time.After(5 * time.Second):
		t.Fatal("api.Lock did not get the lock after holdfast released it")
	}

	// api.Lock holds: holdfast cannot get in, then gets it on release.
	if _, err := m.TryLock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrLocked) {
		t.Fatalf("TryLock while api.Lock holds: %v, want ErrLocked", err)
	}
	type result struct {
		g   *Grant
		err error
		at  time.Time
	}
	res := make(chan result, 1)
	go func() {
		g, err := m.Lock(timeout(t, 10*time.Second))
		res <- result{g, err, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond)
	select {
	case r := <-res:
		t.Fatalf("holdfast Lock returned while api.Lock holds: %v, %v", r.g, r.err)
	default:
	}
	pair, _, err := c.KV().Get(LockKey(name), nil)
	if err != nil || pair == nil {
		t.Fatalf("read the lock key: %v, %v", pair, err)
	}
	released = time.Now()
	if err := waiter.Unlock(); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("holdfast Lock after api.Lock's release: %v", r.err)
	}
	t.Logf("holdfast acquired %v after api.Lock's Unlock", r.at.Sub(released))
	if uint64(r.g.Token()) <= pair.ModifyIndex {
		t.Errorf("token %d is not above the api.Lock's acquire index %d", r.g.Token(), pair.ModifyIndex)
	}
	if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Errorf("keys left: %q", ks)
	}
}

// TestConsulLockCLIInterop: `consul lock <name> cmd` and holdfast exclude
// each other.
func TestConsulLockCLIInterop(t *testing.T) {
	t.Parallel()
	a := agent(t)
	bin, err := embedtest.ConsulBinary()
	if err != nil {
		t.Fatal(err)
	}
	c := a.Client(t)
	name := uniqueName(t)
	m := newMutex(t, newSession(t, c, WithLockDelay(0)), name)

	// consul lock holds while its child runs.
	cmd := exec.Command(bin, "lock", "-shell", "-pass-stdin", "-http-addr="+a.HTTPAddr, name, "echo held; read x")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "held" {
		t.Fatalf("consul lock child: %q, %v", line, err)
	}
	if _, err := m.TryLock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrLocked) {
		t.Errorf("TryLock while `consul lock` holds: %v, want ErrLocked", err)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("consul lock: %v", err)
	}
	g, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Lock after `consul lock` ended: %v", err)
	}

	// holdfast holds: consul lock times out.
	out, err := exec.Command(bin, "lock", "-http-addr="+a.HTTPAddr, "-timeout=500ms", name, "echo child ran").CombinedOutput()
	if err == nil || strings.Contains(string(out), "child ran") {
		t.Errorf("`consul lock` while holdfast holds: err %v, output %q; want a failure without running the child", err, out)
	}
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestTakeover: after the holder's session is destroyed, the waiter at the
// head acquires within lock-delay + 100 ms (api.Lock: 5 s for any non-zero
// delay).
func TestTakeover(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		delay    time.Duration
		behavior string
	}{
		{"delay0", 0, api.SessionBehaviorRelease},
		{"delay1s", time.Second, api.SessionBehaviorRelease},
		{"delay1s-behavior-delete", time.Second, api.SessionBehaviorDelete},
		{"delay15s-default", defaultLockDelay, api.SessionBehaviorRelease},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := agent(t)
			admin := a.Client(t)
			name := uniqueName(t)
			opts := []SessionOption{WithBehavior(tc.behavior)}
			if tc.delay != defaultLockDelay {
				opts = append(opts, WithLockDelay(tc.delay))
			}
			holder := newSession(t, a.Client(t), opts...)
			g, err := newMutex(t, holder, name).Lock(timeout(t, 5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			waiter := newSession(t, a.Client(t), WithLockDelay(0))
			type result struct {
				g   *Grant
				err error
				at  time.Time
			}
			res := make(chan result, 1)
			go func() {
				g, err := newMutex(t, waiter, name).Lock(timeout(t, tc.delay+10*time.Second))
				res <- result{g, err, time.Now()}
			}()
			qkey := name + queueInfix + waiter.ID()
			waitFor(t, 5*time.Second, "waiter queued", func() bool { return slices.Contains(keys(t, admin, name), qkey) })
			time.Sleep(100 * time.Millisecond) // let it start watching the lock key

			t0 := time.Now()
			destroy(t, admin, holder.ID())
			r := <-res
			if r.err != nil {
				t.Fatalf("waiter: %v", r.err)
			}
			took := r.at.Sub(t0)
			t.Logf("lock-delay %v, behavior %s: takeover %v after the destroy", tc.delay, tc.behavior, took)
			if took > tc.delay+100*time.Millisecond {
				t.Errorf("takeover took %v, want at most lock-delay %v + 100 ms", took, tc.delay)
			}
			if took < tc.delay-50*time.Millisecond {
				t.Errorf("takeover took %v, less than the lock-delay %v", took, tc.delay)
			}
			if r.g.Token() <= g.Token() {
				t.Errorf("token %d after %d", r.g.Token(), g.Token())
			}
			if !errors.Is(context.Cause(g.Context()), holdfast.ErrSessionLost) {
				t.Errorf("holder's cause: %v, want ErrSessionLost", context.Cause(g.Context()))
			}
			if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			if ks := keys(t, admin, name); len(ks) != 0 {
				t.Errorf("keys left: %q", ks)
			}
		})
	}
}

// TestPartitionedHolder: a holder whose HTTP traffic is blackholed has its
// grant context cancelled before anybody else acquires the lock.
func TestPartitionedHolder(t *testing.T) {
	t.Parallel()
	a := agent(t)
	name := uniqueName(t)
	p, hc := proxied(t, a)
	const ttl = 10 * time.Second
	holder := newSession(t, hc, WithTTL(ttl), WithLockDelay(0))
	g, err := newMutex(t, holder, name).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var cancelled atomic.Pointer[time.Time]
	context.AfterFunc(g.Context(), func() {
		now := time.Now()
		cancelled.Store(&now)
	})

	other := newSession(t, a.Client(t), WithTTL(ttl), WithLockDelay(0))
	type result struct {
		g   *Grant
		err error
		at  time.Time
	}
	res := make(chan result, 1)
	go func() {
		g, err := newMutex(t, other, name).Lock(timeout(t, 4*ttl))
		res <- result{g, err, time.Now()}
	}()
	waitFor(t, 5*time.Second, "other queued", func() bool { return queueLen(t, a.Client(t), name) == 1 })

	t0 := time.Now()
	p.Blackhole()
	r := <-res
	if r.err != nil {
		t.Fatalf("other: %v", r.err)
	}
	cp := cancelled.Load()
	if cp == nil {
		t.Fatalf("the partitioned holder's grant context is still live %v after the partition, when another client acquired", r.at.Sub(t0))
	}
	t.Logf("partition at 0; holder's grant cancelled at %v; other acquired at %v (%v later)", cp.Sub(t0), r.at.Sub(t0), r.at.Sub(*cp))
	if !cp.Before(r.at) {
		t.Errorf("holder cancelled at %v, not before the other client acquired at %v", cp.Sub(t0), r.at.Sub(t0))
	}
	if cause := context.Cause(g.Context()); !errors.Is(cause, holdfast.ErrSessionLost) {
		t.Errorf("holder's cause: %v, want ErrSessionLost", cause)
	}
	if d := cp.Sub(t0); d > ttl {
		t.Errorf("holder told after %v, more than the TTL", d)
	}
	// Still partitioned: the late Unlock reports the loss, and times out on
	// nothing.
	t1 := time.Now()
	if err := g.Unlock(timeout(t, time.Second)); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("late Unlock: %v, want ErrNotHeld", err)
	}
	if d := time.Since(t1); d > 50*time.Millisecond {
		t.Errorf("Unlock of a grant known to be lost took %v, want at once", d)
	}
	p.Mend()
	if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestSemaphoreConflict: a key used by api.Semaphore is refused with
// ErrConflict, and nothing is written.
func TestSemaphoreConflict(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	sem, err := c.SemaphorePrefix(name, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.Acquire(nil); err != nil {
		t.Fatal(err)
	}
	defer sem.Release()
	before, _, err := c.KV().List(name+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	m := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	if _, err := m.TryLock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrConflict) {
		t.Errorf("TryLock on a semaphore: %v, want ErrConflict", err)
	}
	if _, err := m.Lock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrConflict) {
		t.Errorf("Lock on a semaphore: %v, want ErrConflict", err)
	} else {
		t.Log(err)
	}
	after, _, err := c.KV().List(name+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != len(after) {
		t.Fatalf("keys changed: %d before, %d after", len(before), len(after))
	}
	for i := range before {
		if before[i].Key != after[i].Key || before[i].ModifyIndex != after[i].ModifyIndex {
			t.Errorf("key %s changed: index %d -> %s %d", before[i].Key, before[i].ModifyIndex, after[i].Key, after[i].ModifyIndex)
		}
	}
}

// TestACLDenied: ACL refusals are ErrPermissionDenied, and nothing is
// written.
func TestACLDenied(t *testing.T) {
	t.Parallel()
	a := embedtest.Consul(t, embedtest.WithACL())
	admin := a.Client(t)
	name := uniqueName(t)

	anon, err := a.NewClient(func(cfg *api.Config) { cfg.Token = "anonymous" })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewSession(timeout(t, 5*time.Second), anon); !errors.Is(err, holdfast.ErrPermissionDenied) {
		t.Fatalf("NewSession without permission: %v, want ErrPermissionDenied", err)
	} else {
		t.Log(err)
	}
	if ss, _, err := admin.Session().List(nil); err != nil || len(ss) != 0 {
		t.Errorf("sessions after a refused NewSession: %d, %v", len(ss), err)
	}

	// Sessions allowed, keys read-only.
	pol, _, err := admin.ACL().PolicyCreate(&api.ACLPolicy{
		Name:  "read-only-keys",
		Rules: `session_prefix "" { policy = "write" } key_prefix "" { policy = "read" }`,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := admin.ACL().TokenCreate(&api.ACLToken{Policies: []*api.ACLTokenPolicyLink{{ID: pol.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ro, err := a.NewClient(func(cfg *api.Config) { cfg.Token = tok.SecretID })
	if err != nil {
		t.Fatal(err)
	}
	m := newMutex(t, newSession(t, ro, WithLockDelay(0)), name)
	if _, err := m.Lock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrPermissionDenied) {
		t.Errorf("Lock with read-only keys: %v, want ErrPermissionDenied", err)
	} else {
		t.Log(err)
	}
	if _, err := m.TryLock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrPermissionDenied) {
		t.Errorf("TryLock with read-only keys: %v, want ErrPermissionDenied", err)
	}
	if ks := keys(t, admin, name); len(ks) != 0 {
		t.Errorf("keys written: %q", ks)
	}
}

// TestBadInput: bad options, clients and names are ErrInvalidArgument (or
// its children), before any request.
func TestBadInput(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c, cnt := countingClient(t, a)
	ctx := timeout(t, 5*time.Second)
	cases := []struct {
		name string
		opts []SessionOption
		want error
	}{
		{"TTL 5s", []SessionOption{WithTTL(5 * time.Second)}, holdfast.ErrInvalidTTL},
		{"TTL 25h", []SessionOption{WithTTL(25 * time.Hour)}, holdfast.ErrInvalidTTL},
		{"margin over TTL/2", []SessionOption{WithTTL(10 * time.Second), WithMargin(6 * time.Second)}, holdfast.ErrInvalidTTL},
		{"negative margin", []SessionOption{WithMargin(-time.Second)}, holdfast.ErrInvalidTTL},
		{"lock-delay 61s", []SessionOption{WithLockDelay(61 * time.Second)}, holdfast.ErrInvalidArgument},
		{"negative lock-delay", []SessionOption{WithLockDelay(-time.Second)}, holdfast.ErrInvalidArgument},
		{"behavior", []SessionOption{WithBehavior("keep")}, holdfast.ErrInvalidArgument},
		{"empty node check", []SessionOption{WithNodeChecks("")}, holdfast.ErrInvalidArgument},
	}
	for _, tc := range cases {
		_, err := NewSession(ctx, c, tc.opts...)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := NewSession(ctx, c, WithLockDelay(61*time.Second)); errors.Is(err, holdfast.ErrInvalidTTL) {
		t.Errorf("lock-delay error %v matches ErrInvalidTTL", err)
	}
	if _, err := NewSession(ctx, nil); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("nil client: %v", err)
	}
	//lint:ignore SA1012 checks that a nil context is refused, not a panic
	if _, err := NewSession(nil, c); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("nil context: %v", err)
	}
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d requests sent for bad input, want 0", n)
	}
	if _, err := NewMutex(nil, "a"); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("nil session: %v", err)
	}

	s := newSession(t, a.Client(t), WithLockDelay(0))
	for _, name := range []string{"", "/a", "a/", "a//b", "a b", "a/.lock", "x/.queue/y", ".queue"} {
		if _, err := NewMutex(s, name); !errors.Is(err, holdfast.ErrInvalidName) {
			t.Errorf("NewMutex(%q): %v, want ErrInvalidName", name, err)
		}
	}
	m := newMutex(t, s, uniqueName(t))
	//lint:ignore SA1012 checks that a nil context is refused, not a panic
	if _, err := m.Lock(nil); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Lock(nil): %v", err)
	}
}

// TestSessionOptionsOnTheWire: what NewSession asks is what Consul has,
// including a lock-delay of 0 and no node checks.
func TestSessionOptionsOnTheWire(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	cases := []struct {
		opts   []SessionOption
		delay  time.Duration
		ttl    string
		behav  string
		checks []string
		name   string
	}{
		{nil, 15 * time.Second, "15s", "delete", nil, "holdfast"},
		{[]SessionOption{WithLockDelay(0), WithTTL(10 * time.Second)}, 0, "10s", "delete", nil, "holdfast"},
		{[]SessionOption{WithLockDelay(1500 * time.Millisecond), WithBehavior(api.SessionBehaviorRelease)}, 1500 * time.Millisecond, "15s", "release", nil, "holdfast"},
		{[]SessionOption{WithNodeChecks("serfHealth"), WithSessionName("named")}, 15 * time.Second, "15s", "delete", []string{"serfHealth"}, "named"},
	}
	for i, tc := range cases {
		s := newSession(t, c, tc.opts...)
		info, _, err := c.Session().Info(s.ID(), nil)
		if err != nil || info == nil {
			t.Fatalf("case %d: info: %v, %v", i, info, err)
		}
		if info.LockDelay != tc.delay || info.TTL != tc.ttl || info.Behavior != tc.behav || !slices.Equal(info.NodeChecks, tc.checks) && len(info.NodeChecks)+len(tc.checks) != 0 || len(info.Checks) != 0 {
			t.Errorf("case %d: Consul has lock-delay %v, TTL %s, behavior %s, node checks %q, checks %q; want %v, %s, %s, %q, none",
				i, info.LockDelay, info.TTL, info.Behavior, info.NodeChecks, info.Checks, tc.delay, tc.ttl, tc.behav, tc.checks)
		}
		if suffix, ok := strings.CutPrefix(info.Name, tc.name+" "); !ok || len(suffix) != 26 {
			t.Errorf("case %d: session name %q, want %q, a space and 26 random characters", i, info.Name, tc.name)
		}
	}
}

// TestManyLocksOneSession: many locks share one session.
func TestManyLocksOneSession(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	sname := uniqueName(t)
	s := newSession(t, c, WithLockDelay(0), WithSessionName(sname))
	base := uniqueName(t)
	const n = 300
	var grants []*Grant
	for i := range n {
		g, err := newMutex(t, s, base+"/"+strconv.Itoa(i)).Lock(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if g.s.id != s.ID() {
			t.Fatalf("grant of session %s, want %s", g.s.id, s.ID())
		}
		grants = append(grants, g)
	}
	ss, _, err := c.Session().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, e := range ss {
		if strings.HasPrefix(e.Name, sname+" ") {
			count++
		}
	}
	if count != 1 {
		t.Errorf("%d sessions for %d locks, want 1", count, n)
	}
	for _, g := range grants {
		if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if ks := keys(t, c, base); len(ks) != 0 {
		t.Errorf("%d keys left", len(ks))
	}
}

// TestRoundTrips counts HTTP requests: uncontended Lock 2 (a read-only
// transaction, then the acquiring one), Unlock 1.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c, cnt := countingClient(t, a)
	name := uniqueName(t)
	s := newSession(t, c, WithLockDelay(0), WithTTL(time.Hour)) // renewals out of the way
	m := newMutex(t, s, name)
	time.Sleep(50 * time.Millisecond) // the session watch's first query
	for i := range 3 {
		n0 := cnt.n.Load()
		g, err := m.Lock(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n1 := cnt.n.Load()
		if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		n2 := cnt.n.Load()
		t.Logf("uncontended cycle %d: Lock %d requests, Unlock %d", i, n1-n0, n2-n1)
		if n1-n0 != 2 || n2-n1 != 1 {
			t.Errorf("uncontended cycle %d: Lock %d requests, Unlock %d; want 2 and 1", i, n1-n0, n2-n1)
		}
	}

	// Contended: a holder on another session; our Lock queues, becomes the
	// head, watches the lock key, and takes it on release.
	oc, ocnt := countingClient(t, a)
	other := newMutex(t, newSession(t, oc, WithLockDelay(0), WithTTL(time.Hour)), name)
	for i := range 2 {
		g, err := other.Lock(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n0 := cnt.n.Load()
		done := make(chan *Grant, 1)
		go func() {
			g, err := m.Lock(timeout(t, 5*time.Second))
			if err != nil {
				t.Error(err)
			}
			done <- g
		}()
		time.Sleep(100 * time.Millisecond)
		o0 := ocnt.n.Load()
		if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		// The holder took the free lock, nobody behind it: its delete,
		// guarded by the tail key it set, fails (we queued); the answer of
		// its subtree holds our link; it hands the lock over.
		if n := ocnt.n.Load() - o0; n != 3 {
			t.Errorf("contended, try %d: the holder's Unlock made %d requests, want 3", i, n)
		}
		mine := <-done
		// List the names, queue up, link behind the holder's entry (whose
		// value, in the link's answer, is the holder's lock-delay), block on
		// our entry's subtree; the holder hands the lock over.
		n := cnt.n.Load() - n0
		want := int64(4)
		t.Logf("contended (head of the queue), try %d: Lock %d requests", i, n)
		if n != want {
			t.Errorf("contended (head of the queue), try %d: Lock %d requests, want %d", i, n, want)
		}
		if mine != nil {
			if err := mine.Unlock(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestFairHandoff: 8 contenders, each with its own client and session, hold
// the lock 1 ms in turn for 2 s: every one gets about the same share, and
// nobody is ever inside with anybody else.
func TestFairHandoff(t *testing.T) {
	t.Parallel()
	a := agent(t)
	name := uniqueName(t)
	const n = 8
	const run = 2 * time.Second
	var (
		inside, overlaps atomic.Int32
		counts           [n]int
		lastHolder       atomic.Int32
		handoffs         atomic.Int64
		requests         atomic.Int64
		wg               sync.WaitGroup
	)
	lastHolder.Store(-1)
	ctx := timeout(t, run+10*time.Second)
	stop := time.Now().Add(run)
	for i := range n {
		c, cnt := countingClient(t, a)
		m := newMutex(t, newSession(t, c, WithLockDelay(0), WithTTL(time.Hour)), name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { requests.Add(cnt.n.Load()) }()
			for time.Now().Before(stop) {
				g, err := m.Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				if lastHolder.Swap(int32(i)) != int32(i) {
					handoffs.Add(1)
				}
				counts[i]++
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				if err := g.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	total, sq := 0.0, 0.0
	for _, k := range counts {
		total += float64(k)
		sq += float64(k) * float64(k)
	}
	jain := total * total / (n * sq)
	t.Logf("8 contenders, hold 1 ms, %v: %v acquisitions (%.0f/s), %d handoffs (%.0f/s), fairness %.3f, %.1f requests per acquisition (incl. session create/watch)",
		run, counts, total/run.Seconds(), handoffs.Load(), float64(handoffs.Load())/run.Seconds(), jain, float64(requests.Load())/total)
	if o := overlaps.Load(); o != 0 {
		t.Errorf("%d overlaps", o)
	}
	if jain < 0.9 {
		t.Errorf("fairness %.3f, want >= 0.9", jain)
	}
}

// TestDoubleUnlock: a second Unlock is ErrNotHeld and leaves the next holder
// alone.
func TestDoubleUnlock(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	m1 := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	m2 := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	g1, err := m1.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := g1.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	g2, err := m2.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := g1.Unlock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("second Unlock: %v, want ErrNotHeld", err)
	}
	if pair, _, err := c.KV().Get(LockKey(name), nil); err != nil || pair == nil || pair.Session != g2.s.id || pair.ModifyIndex != uint64(g2.Token()) {
		t.Errorf("lock key after the second Unlock: %+v, %v; want held by the next holder", pair, err)
	}
	if err := g2.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestWaiterSessionLost: a waiter whose session is destroyed stops at once
// with ErrSessionLost and leaves nothing; a new Lock through the dead
// session fails.
func TestWaiterSessionLost(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	g, err := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ws := newSession(t, a.Client(t), WithLockDelay(time.Second))
	wm := newMutex(t, ws, name)
	res := make(chan error, 1)
	go func() {
		_, err := wm.Lock(timeout(t, 30*time.Second))
		res <- err
	}()
	waitFor(t, 5*time.Second, "waiter queued", func() bool { return queueLen(t, admin, name) == 1 })
	t0 := time.Now()
	destroy(t, admin, ws.ID())
	err = <-res
	took := time.Since(t0)
	t.Logf("waiter returned %v after its session was destroyed: %v", took, err)
	if took > 100*time.Millisecond {
		t.Errorf("waiter returned %v after its session was destroyed, want < 100 ms", took)
	}
	if !errors.Is(err, holdfast.ErrSessionLost) {
		t.Errorf("waiter: %v, want ErrSessionLost", err)
	}
	waitFor(t, cleanupBound, "the lost waiter's queue key removed", func() bool { return slices.Equal(contenderKeys(t, admin, name), []string{LockKey(name)}) })
	if _, err := wm.Lock(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrSessionLost) {
		t.Errorf("Lock on a lost session: %v, want ErrSessionLost", err)
	}
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestCleanupWhenReachable: a waiter gives up while a partition drops its
// traffic to Consul (the proxy blackholes it), so its queue key stays; its
// Lock returns on time all the same. As soon as Consul is reachable again,
// the session removes what the waiter left (its queue key, or the lock that
// the holder handed to it meanwhile) within cleanupBound, and the contender
// queued behind it gets the lock.
func TestCleanupWhenReachable(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	hg, err := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p, wc := proxied(t, a)
	ws := newSession(t, wc, WithLockDelay(0))
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	wm := newMutex(t, ws, name)
	res := queueUp(t, admin, wm, wctx)

	p.Blackhole()
	t0 := time.Now()
	wcancel()
	if r := receive(t, res, time.Second, "waiter"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("waiter: %v, want context.Canceled", r.err)
	}
	if d := time.Since(t0); d > onTime {
		t.Errorf("waiter returned %v after its context was cancelled, want < %v", d, onTime)
	}
	time.Sleep(300 * time.Millisecond)
	if !slices.Contains(keys(t, admin, name), wm.queueKey()) {
		t.Fatal("the waiter's queue key is gone although Consul was unreachable: the test proves nothing")
	}
	next := queueUp(t, admin, newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name), timeout(t, 30*time.Second))
	if err := hg.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// The holder handed the lock to the waiter that gave up (its queue key
	// was still there): the waiter's cleanup must release it.
	t1 := time.Now()
	p.Mend()
	r := receive(t, next, cleanupBound, "contender behind the stale key")
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("contender behind the stale key got the lock %v after the partition ended", time.Since(t1))
	if slices.Contains(keys(t, admin, name), wm.queueKey()) {
		t.Errorf("stale queue key still there")
	}
	if ws.Err() != nil {
		t.Errorf("waiter's session ended: %v", ws.Err())
	}
	if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, admin, name); len(ks) != 0 {
		t.Errorf("keys left: %q", ks)
	}
}
