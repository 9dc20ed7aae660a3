package consul

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
)

// liveBound is how long a live waiter may still wait once the lock is free
// in Consul, when no session ended (issue 25's liveness bound).
const liveBound = time.Second

// faultClient returns a client of a whose requests go through a new
// FaultTransport, closed with the test.
func faultClient(t testing.TB, a *embedtest.ConsulAgent) (*api.Client, *embedtest.FaultTransport) {
	t.Helper()
	ft := &embedtest.FaultTransport{}
	t.Cleanup(ft.Close)
	c, err := a.NewClient(func(cfg *api.Config) { cfg.HttpClient = &http.Client{Transport: ft} })
	if err != nil {
		t.Fatal(err)
	}
	return c, ft
}

// deletesKey matches the transactions that delete key itself (delete or
// delete-tree of exactly key).
func deletesKey(key string) embedtest.FaultMatch {
	return func(method, path string, body []byte) bool {
		if path != "/v1/txn" {
			return false
		}
		for _, op := range embedtest.TxnOps(body) {
			if op.Key == key && (op.Verb == string(api.KVDelete) || op.Verb == string(api.KVDeleteTree)) {
				return true
			}
		}
		return false
	}
}

// linked waits until w's link under p's entry is in Consul.
func linked(t *testing.T, c *api.Client, p, w *Mutex) {
	t.Helper()
	link := p.queueKey() + nextInfix + w.s.ID()
	waitFor(t, 5*time.Second, "w linked behind p", func() bool { return slices.Contains(keys(t, c, p.name), link) })
}

// TestLeaveLostWakeup (issue 25, defect 1): P waits at the head behind a
// native api.Lock holder, W is linked behind P; P leaves (its Lock is
// cancelled, or its Unlock finds the lock key deleted) and one request of
// its leave is faulted: the wake-up of W refused, or the read-and-delete of
// P's entry applied with its answer lost. Once the lock is free, W is
// granted within a second. Before the fix, the leave's retry found P's
// subtree gone and woke nobody: W still waited 5 s later (until P's session
// ended).
func TestLeaveLostWakeup(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	cases := []struct {
		name   string
		mode   embedtest.FaultMode
		wake   bool // fault the wake-up (else the first step of the leave)
		unlock bool // P holds and its Unlock finds the key gone (else P waits and is cancelled)
	}{
		{"cancel/wake-refused", embedtest.FaultRefuse, true, false},
		{"cancel/leave-answer-lost", embedtest.FaultLoseAnswer, false, false},
		{"unlock-key-gone/wake-refused", embedtest.FaultRefuse, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := uniqueName(t)
			pc, ft := faultClient(t, a)
			p := newMutex(t, newSession(t, pc, WithLockDelay(0)), name)
			w := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)
			pctx, cancelP := context.WithCancel(context.Background())
			defer cancelP()
			var pg *Grant
			var release func()
			if tc.unlock {
				var err error
				if pg, err = p.Lock(timeout(t, 5*time.Second)); err != nil {
					t.Fatal(err)
				}
			} else {
				release = foreignHolder(t, admin, name)
				queueUp(t, admin, p, pctx)
			}
			wres := queueUp(t, admin, w, timeout(t, 20*time.Second))
			linked(t, admin, p, w)
			match := deletesKey(p.queueKey())
			if tc.wake {
				match = embedtest.TxnHas(string(api.KVDelete), w.queueKey()+prevInfix+p.s.ID())
			}
			f := ft.Inject(match, 1, tc.mode)
			freed := time.Now()
			if tc.unlock {
				if _, err := admin.KV().Delete(LockKey(name), nil); err != nil {
					t.Fatal(err)
				}
				_ = pg.Unlock(timeout(t, 5*time.Second))
			} else {
				cancelP()
			}
			select {
			case <-f.Fired():
			case <-time.After(5 * time.Second):
				t.Fatal("the fault did not fire: the test proves nothing")
			}
			<-f.Done()
			time.Sleep(100 * time.Millisecond) // the leave's retries
			if release != nil {
				release()
				freed = time.Now()
			}
			select {
			case r := <-wres:
				if r.err != nil {
					t.Fatal(r.err)
				}
				t.Logf("W granted %v after the lock was free", time.Since(freed))
				_ = r.g.Unlock(timeout(t, 5*time.Second))
			case <-time.After(5 * time.Second):
				t.Fatalf("W still waits %v after the lock was free (keys %v)", time.Since(freed), keys(t, admin, name))
			}
			if d := time.Since(freed); d > liveBound {
				t.Errorf("W granted %v after the lock was free, want within %v", d, liveBound)
			}
		})
	}
}

// lateSetup is what lateQueueUp leaves: H holds the name (grant hg); S's
// Lock gave up, and its queue-up landed after that; W has not started.
type lateSetup struct {
	admin   *api.Client
	name    string
	h, s, w *Mutex
	hg      *Grant
}

// lateQueueUp sets up issue 25's defect 2: H holds; S's Lock, bounded by
// wait, sends its queue-up, which Consul gets late more after S's call
// (so after the Lock gave up and its cleanup ran): S's entry stays, with
// no Lock behind it.
func lateQueueUp(t *testing.T, wait, late time.Duration) lateSetup {
	t.Helper()
	a := agent(t)
	l := lateSetup{admin: a.Client(t), name: uniqueName(t)}
	l.h = newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), l.name)
	sc, ft := faultClient(t, a)
	l.s = newMutex(t, newSession(t, sc, WithLockDelay(0)), l.name)
	l.w = newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), l.name)
	var err error
	if l.hg, err = l.h.Lock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	f := ft.Inject(embedtest.TxnHas(string(api.KVLock), l.s.tailKey()), 1, embedtest.FaultLate)
	f.Late = late
	if g, err := l.s.Lock(timeout(t, wait)); err == nil {
		_ = g.Unlock(timeout(t, 5*time.Second))
		t.Fatal("S's Lock succeeded: its queue-up was held")
	}
	<-f.Done()
	if !slices.Contains(keys(t, l.admin, l.name), l.s.queueKey()) {
		t.Fatal("S's late queue-up left no entry: the test proves nothing")
	}
	return l
}

// TestLateQueueUp (issue 25, defect 2): H holds; S's Lock has a 1 s
// context and its queue-up reaches Consul only after the Lock gave up and
// its cleanup ran. W queues behind, H unlocks: W is granted within 1.5 s
// (the session sweeps S's late entry 250 ms after the cleanup, then again
// later), and once W unlocks nothing is left under the name. Before the
// fix, H handed the lock to S's late entry: the lock key stayed with S's
// live session, and W still waited 5 s later (until S's session ended).
func TestLateQueueUp(t *testing.T) {
	t.Parallel()
	l := lateQueueUp(t, time.Second, 100*time.Millisecond)
	admin, name, w, hg := l.admin, l.name, l.w, l.hg
	wres := queueUp(t, admin, w, timeout(t, 20*time.Second))
	if err := hg.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	select {
	case r := <-wres:
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Logf("W granted %v after H's Unlock", time.Since(freed))
		if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("W still waits %v after H's Unlock (lock key %+v, keys %v)", time.Since(freed), lockKeyNow(t, admin, name), keys(t, admin, name))
	}
	if d := time.Since(freed); d > 1500*time.Millisecond {
		t.Errorf("W granted %v after H's Unlock, want within 1.5 s", d)
	}
	waitFor(t, 2*time.Second, "nothing left under the name", func() bool { return len(keys(t, admin, name)) == 0 })
}

// TestRefusedRetried (issue 25, defect 8): what Consul refuses without
// applying it (a 500 "Missing node registration" for a moment after an
// agent starts, "No cluster leader" during an election) is sent again:
// NewSession and a Lock whose first request is refused succeed. Before the
// fix, NewSession failed with the refusal (a CI run of TestStatusConsul).
func TestRefusedRetried(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c, ft := faultClient(t, a)
	f := ft.Inject(func(method, path string, _ []byte) bool { return path == "/v1/session/create" }, 1, embedtest.FaultRefuse)
	f.Refusal = "apply failed: Missing node registration"
	s := newSession(t, c, WithLockDelay(0))
	select {
	case <-f.Fired():
	default:
		t.Fatal("the session's creation was not refused: the test proves nothing")
	}
	m := newMutex(t, s, uniqueName(t))
	f = ft.Inject(embedtest.TxnHas("", m.lockKey()), 1, embedtest.FaultRefuse)
	f.Refusal = "No cluster leader"
	g, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Lock with its first transaction refused: %v", err)
	}
	<-f.Fired()
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestDeadKeysUnderName (issue 25, defect 7): keys under NAME/ that are
// nobody's live lock (a plain data key, the contender key of an
// api.Semaphore whose session ended) do not refuse a Mutex on NAME, and
// are left alone; a key held by a live session does (ErrConflict). Before
// the fix, Lock and TryLock failed at once with ErrConflict.
func TestDeadKeysUnderName(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 20*time.Second)
	if _, err := admin.KV().Put(&api.KVPair{Key: name + "/config", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	dead, _, err := admin.Session().Create(&api.SessionEntry{TTL: "10s", Checks: []string{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := admin.KV().Acquire(&api.KVPair{Key: name + "/" + dead, Flags: api.SemaphoreFlagValue, Session: dead}, nil); err != nil || !ok {
		t.Fatalf("semaphore contender key: %v, %v", ok, err)
	}
	destroy(t, admin, dead)
	before := keys(t, admin, name)
	s := newSession(t, a.Client(t), WithLockDelay(0))
	for _, try := range []bool{false, true} {
		m := newMutex(t, s, name)
		var g *Grant
		if try {
			g, err = m.TryLock(ctx)
		} else {
			g, err = m.Lock(ctx)
		}
		if err != nil {
			t.Fatalf("try=%v with only dead keys under the name: %v", try, err)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if after := keys(t, admin, name); !slices.Equal(before, after) {
		t.Errorf("keys under the name: %q, want %q (left alone)", after, before)
	}
	// A live key under the name still refuses it.
	live, _, err := admin.Session().Create(&api.SessionEntry{TTL: "10s", Checks: []string{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer destroy(t, admin, live)
	if ok, _, err := admin.KV().Acquire(&api.KVPair{Key: name + "/held", Session: live}, nil); err != nil || !ok {
		t.Fatalf("live key: %v, %v", ok, err)
	}
	for _, try := range []bool{false, true} {
		m := newMutex(t, s, name)
		if try {
			_, err = m.TryLock(ctx)
		} else {
			_, err = m.Lock(ctx)
		}
		if !errors.Is(err, holdfast.ErrConflict) {
			t.Errorf("try=%v with a live key under the name: %v, want ErrConflict", try, err)
		}
	}
}

// TestDeadHolderLeftovers (issue 25, defect 6b's state): S was handed the
// lock, then its session ended while S could not reach Consul (a 60 s
// freeze: its process gave up and exited), so with Behavior release its
// entry, held mark and the link behind it stay, freed. They refuse nobody: the next contender takes
// the lock, drops them, and once it unlocks nothing is left.
func TestDeadHolderLeftovers(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	h := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)
	p, pc := proxied(t, a)
	ss := newSession(t, pc, WithLockDelay(0), WithBehavior(api.SessionBehaviorRelease))
	t.Cleanup(p.Mend) // before ss.Close
	s := newMutex(t, ss, name)
	w := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)
	ctx := timeout(t, 20*time.Second)
	hg, err := h.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sres := queueUp(t, admin, s, ctx)
	linked(t, admin, h, s)
	if err := hg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := receive(t, sres, 5*time.Second, "S")
	if r.err != nil {
		t.Fatal(r.err)
	}
	wres := queueUp(t, admin, w, ctx)
	linked(t, admin, s, w)
	p.Blackhole()
	destroy(t, admin, ss.ID()) // Consul invalidates S's session; S cannot clean up
	select {
	case r := <-wres:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if err := r.g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("W still waits 5 s after S's session ended: keys %v", keys(t, admin, name))
	}
	n, err := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name).Lock(ctx)
	if err != nil {
		t.Fatalf("a new Lock after S's death: %v", err)
	}
	if err := n.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "nothing left under the name", func() bool { return len(keys(t, admin, name)) == 0 })
}

// TestDeadEntryDroppedAfterRefusal: S holds, W waits linked behind it; S is
// cut off (as by a partition, or kill -9) and its session ends (destroyed
// here, as Consul expires it: with Behavior release, S's entry and held
// mark stay, free). W meets them as dead, and its request that deletes them is
// refused once. W is granted, and S's dead keys are gone within the cleanup
// bound all the same. Before, the deletion was tried once: S's entry and
// held mark stayed for good, since the queue is not read again on the way
// to the lock (seen as keys_left=[<name>/.queue/<S> <name>/.queue/<S>/held]
// by TestConsulMutexUnderFaults).
func TestDeadEntryDroppedAfterRefusal(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	px, sc := proxied(t, a)
	s := newMutex(t, newSession(t, sc, WithLockDelay(0), WithBehavior(api.SessionBehaviorRelease)), name)
	wc, ft := faultClient(t, a)
	w := newMutex(t, newSession(t, wc, WithLockDelay(0)), name)
	if _, err := s.Lock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	wres := queueUp(t, admin, w, timeout(t, 20*time.Second))
	linked(t, admin, s, w)
	f := ft.Inject(embedtest.TxnHas(string(api.KVDeleteCAS), s.queueKey()), 1, embedtest.FaultRefuse)
	px.Blackhole()
	defer px.Mend() // before the sessions' Close
	destroy(t, admin, s.s.ID())
	r := <-wres
	if r.err != nil {
		t.Fatal(r.err)
	}
	select {
	case <-f.Fired():
	case <-time.After(5 * time.Second):
		t.Fatal("the fault did not fire: the test proves nothing")
	}
	waitFor(t, cleanupBound, "S's dead entry and held mark deleted", func() bool {
		for _, k := range keys(t, admin, name) {
			if strings.HasPrefix(k, s.queueKey()) {
				return false
			}
		}
		return true
	})
	if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestTryLockDropsDeadEntries: a holder S is cut off (kill -9, a
// partition) and its session ends (destroyed here, as Consul expires it:
// with Behavior release, its entry, held mark, tail key and lock key stay,
// free). A TryLock of another session takes the lock, and once it is
// unlocked nothing is left under the name. Before, TryLock read the dead
// entry and left it: S's entry and held mark stayed for good (seen with
// `holdfast lock --try` after a kill -9 of the holder).
func TestTryLockDropsDeadEntries(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	px, sc := proxied(t, a)
	s := newMutex(t, newSession(t, sc, WithLockDelay(0), WithBehavior(api.SessionBehaviorRelease)), name)
	if _, err := s.Lock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	px.Blackhole()
	defer px.Mend() // before the sessions' Close
	destroy(t, admin, s.s.ID())
	g, err := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name).TryLock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, cleanupBound, "nothing left under the name", func() bool { return len(keys(t, admin, name)) == 0 })
}
