package consul

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/leader"
)

var _ leader.Candidate[*Grant] = (*Election)(nil)

func newElection(t testing.TB, s *Session, name string) *Election {
	t.Helper()
	e, err := NewElection(s, name)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// nextLeader receives from ch within bound, or fails t.
func nextLeader(t testing.TB, ch <-chan holdfast.Leader, bound time.Duration) holdfast.Leader {
	t.Helper()
	select {
	case l, ok := <-ch:
		if !ok {
			t.Fatal("Observe's channel closed")
		}
		return l
	case <-time.After(bound):
		t.Fatalf("no leader change within %v", bound)
	}
	return holdfast.Leader{}
}

func TestElectionBasics(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	s := newSession(t, c, WithLockDelay(0))
	e := newElection(t, s, name)
	ctx := timeout(t, 20*time.Second)
	if _, err := e.Leader(ctx); !errors.Is(err, holdfast.ErrNoLeader) {
		t.Fatalf("Leader with no candidate: %v", err)
	}
	if err := e.Proclaim(ctx, []byte("x")); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("Proclaim before Campaign: %v", err)
	}
	if err := e.Resign(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("Resign before Campaign: %v", err)
	}
	g, err := e.Campaign(ctx, []byte("a:1"))
	if err != nil {
		t.Fatal(err)
	}
	kv, _, err := c.KV().Get(LockKey(name), nil)
	if err != nil || kv == nil {
		t.Fatalf("lock key: %v %v", kv, err)
	}
	if kv.Session != s.ID() || string(kv.Value) != "a:1" || kv.Flags != api.LockFlagValue || holdfast.Token(kv.ModifyIndex) != g.Token() || kv.LockIndex != 1 {
		t.Fatalf("lock key %+v, grant token %d", kv, g.Token())
	}
	l, err := e.Leader(ctx)
	if err != nil || l.Key != LockKey(name) || string(l.Value) != "a:1" || l.Term != g.Token() {
		t.Fatalf("Leader: %+v %v", l, err)
	}
	if err := e.Proclaim(ctx, []byte("a:2")); err != nil {
		t.Fatal(err)
	}
	kv, _, _ = c.KV().Get(LockKey(name), nil)
	if kv.Session != s.ID() || string(kv.Value) != "a:2" || kv.Flags != api.LockFlagValue || kv.LockIndex != 1 {
		t.Fatalf("after Proclaim: %+v", kv)
	}
	if l, err = e.Leader(ctx); err != nil || string(l.Value) != "a:2" || l.Term != g.Token() {
		t.Fatalf("Leader after Proclaim: %+v %v (term must stay %d)", l, err, g.Token())
	}
	if g.Context().Err() != nil {
		t.Fatal("Proclaim ended the leadership")
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Leader(ctx); !errors.Is(err, holdfast.ErrNoLeader) {
		t.Fatalf("Leader after Resign: %v", err)
	}
	if err := e.Resign(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("second Resign: %v", err)
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// TestElectionLockDelayFailover: the leader's session is destroyed (as
// Consul invalidates it); the next candidate wins when the 300 ms lock-delay
// ends, not on a coarse tick: within lock-delay + 0.5 s, with a term above
// the old one, read back by Observe.
func TestElectionLockDelayFailover(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	const delay = 300 * time.Millisecond
	ctx := timeout(t, 30*time.Second)
	obs := newElection(t, newSession(t, c), name).Observe(ctx)
	nextLeader(t, obs, 5*time.Second)
	s1 := newSession(t, c, WithLockDelay(delay))
	g1, err := newElection(t, s1, name).Campaign(ctx, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	if l := nextLeader(t, obs, 5*time.Second); l.Term != g1.Token() {
		t.Fatalf("Observe: %+v, want term %d", l, g1.Token())
	}
	c2, cnt := countingClient(t, a)
	s2 := newSession(t, c2, WithLockDelay(delay))
	won := make(chan *Grant, 1)
	go func() {
		g, err := newElection(t, s2, name).Campaign(ctx, []byte("two"))
		if err != nil {
			t.Error(err)
		}
		won <- g
	}()
	waitFor(t, 5*time.Second, "the candidate queued", func() bool { return queueLen(t, c, name) == 1 })
	time.Sleep(100 * time.Millisecond) // at the head, watching the lock key
	start, n0 := time.Now(), cnt.n.Load()
	destroy(t, c, s1.ID())
	g2 := <-won
	took, requests := time.Since(start), cnt.n.Load()-n0
	if g2 == nil {
		return
	}
	t.Logf("failover after session destroy: %v, %d requests (lock-delay %v)", took, requests, delay)
	// Knowing the old leader's lock-delay (its queue entry states it), the
	// candidate retries once when it ends, instead of polling every
	// delayRetry (about 12 more requests over 300 ms).
	if requests > 8 {
		t.Errorf("the candidate made %d requests from the destroy to its win, want <= 8 (it polled: it did not know the lock-delay)", requests)
	}
	if took > delay+500*time.Millisecond || took < delay-50*time.Millisecond {
		t.Fatalf("failover took %v, want within [%v, %v]", took, delay, delay+500*time.Millisecond)
	}
	if g1.Context().Err() == nil {
		t.Fatal("the old leader's context is still alive")
	}
	if g2.Token() <= g1.Token() {
		t.Fatalf("term %d after %d", g2.Token(), g1.Token())
	}
	for { // Observe may or may not see the free key in between
		l := nextLeader(t, obs, 5*time.Second)
		if l.None() {
			continue
		}
		if l.Term != g2.Token() || string(l.Value) != "two" {
			t.Fatalf("Observe: %+v, want term %d", l, g2.Token())
		}
		break
	}
}

// TestElectionAPILockInterop: api.Lock on the election's key and holdfast
// candidates exclude each other, and Observe reports the api.Lock holder
// (its value, its acquiring write's index as term).
func TestElectionAPILockInterop(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 30*time.Second)
	obs := newElection(t, newSession(t, c), name).Observe(ctx)
	nextLeader(t, obs, 5*time.Second)

	native, err := c.LockOpts(&api.LockOptions{Key: LockKey(name), Value: []byte("native"), SessionTTL: "10s", LockDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := native.Lock(nil); err != nil {
		t.Fatal(err)
	}
	kv, _, _ := c.KV().Get(LockKey(name), nil)
	l := nextLeader(t, obs, 5*time.Second)
	if string(l.Value) != "native" || l.Term != holdfast.Token(kv.ModifyIndex) {
		t.Fatalf("Observe of api.Lock: %+v, key %+v", l, kv)
	}
	e := newElection(t, newSession(t, c, WithLockDelay(0)), name)
	won := make(chan *Grant, 1)
	go func() {
		g, err := e.Campaign(ctx, []byte("holdfast"))
		if err != nil {
			t.Error(err)
		}
		won <- g
	}()
	select {
	case <-won:
		t.Fatal("holdfast won while api.Lock holds the key")
	case <-time.After(300 * time.Millisecond):
	}
	if err := native.Unlock(); err != nil {
		t.Fatal(err)
	}
	g := <-won
	if g == nil {
		return
	}
	if g.Token() <= l.Term {
		t.Fatalf("term %d after api.Lock's %d", g.Token(), l.Term)
	}
	for {
		l := nextLeader(t, obs, 5*time.Second)
		if l.None() {
			continue
		}
		if l.Term != g.Token() || string(l.Value) != "holdfast" {
			t.Fatalf("Observe: %+v, want term %d", l, g.Token())
		}
		break
	}
	// api.Lock waits while holdfast leads.
	locked := make(chan error, 1)
	stop := make(chan struct{})
	go func() { _, err := native.Lock(stop); locked <- err }()
	select {
	case err := <-locked:
		t.Fatalf("api.Lock got the key while holdfast leads: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-locked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("api.Lock did not get the key after Resign")
	}
	_ = native.Unlock()
}

// TestProclaimGuarded: a Proclaim after the key was released from outside
// (free, or taken by another session), before the grant noticed, writes
// nothing: in particular it does not acquire the free key again.
func TestProclaimGuarded(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	ctx := timeout(t, 20*time.Second)
	for _, takeover := range []bool{false, true} {
		name := uniqueName(t)
		s := newSession(t, c, WithLockDelay(0))
		e := newElection(t, s, name)
		if _, err := e.Campaign(ctx, []byte("mine")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.KV().Release(&api.KVPair{Key: LockKey(name), Session: s.ID(), Flags: api.LockFlagValue, Value: []byte("released")}, nil); err != nil {
			t.Fatal(err)
		}
		want := "released"
		if takeover {
			other := newSession(t, c, WithLockDelay(0))
			if ok, _, err := c.KV().Acquire(&api.KVPair{Key: LockKey(name), Session: other.ID(), Flags: api.LockFlagValue, Value: []byte("impostor")}, nil); err != nil || !ok {
				t.Fatalf("acquire by another session: %v %v", ok, err)
			}
			want = "impostor"
		}
		if err := e.Proclaim(ctx, []byte("overwrite")); !errors.Is(err, holdfast.ErrNotHeld) {
			t.Fatalf("takeover %v: Proclaim: %v, want ErrNotHeld", takeover, err)
		}
		kv, _, _ := c.KV().Get(LockKey(name), nil)
		if kv == nil || string(kv.Value) != want || kv.Session == s.ID() {
			t.Fatalf("takeover %v: Proclaim wrote the key: %+v", takeover, kv)
		}
	}
}

// TestObserveTermsInOrder: leaders in quick succession (resigns and session
// destroys); Observe delivers terms in increasing order, ends with the last
// leader, and closes with its context.
func TestObserveTermsInOrder(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obs := newElection(t, newSession(t, c), name).Observe(ctx)
	got := make(chan []holdfast.Leader, 1)
	lastTerm := make(chan holdfast.Token, 1)
	go func() {
		var seen []holdfast.Leader
		want := <-lastTerm
		for l := range obs {
			seen = append(seen, l)
			if l.Term == want {
				break
			}
		}
		got <- seen
	}()
	var term holdfast.Token
	for i := range 10 {
		s := newSession(t, c, WithLockDelay(0))
		e := newElection(t, s, name)
		g, err := e.Campaign(ctx, fmt.Appendf(nil, "v%d", i))
		if err != nil {
			t.Fatal(err)
		}
		term = g.Token()
		if i == 9 {
			break
		}
		if i%2 == 0 {
			if err := e.Resign(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			destroy(t, c, s.ID())
		}
	}
	lastTerm <- term
	var seen []holdfast.Leader
	select {
	case seen = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("Observe never delivered the last leader")
	}
	var prev holdfast.Token
	for _, l := range seen {
		if l.None() {
			continue
		}
		if l.Term <= prev {
			t.Fatalf("terms out of order: %v", seen)
		}
		prev = l.Term
	}
	cancel()
	for range obs {
	}
}

// TestCampaignHandedByMutex: a holdfast Mutex on the election's name hands
// its lock to the candidate at the head of the queue; the candidate writes
// the key anew with its value.
func TestCampaignHandedByMutex(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 20*time.Second)
	mg, err := newMutex(t, newSession(t, c, WithLockDelay(0)), name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := newElection(t, newSession(t, c, WithLockDelay(0)), name)
	won := make(chan *Grant, 1)
	go func() {
		g, err := e.Campaign(ctx, []byte("cand"))
		if err != nil {
			t.Error(err)
		}
		won <- g
	}()
	waitFor(t, 5*time.Second, "the candidate queued", func() bool { return queueLen(t, c, name) == 1 })
	// The candidate linked itself behind the holder's entry: the Unlock
	// hands the key to it at once (at worst it waits 250 ms for the link,
	// then reads the queue).
	t0 := time.Now()
	if err := mg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("Unlock took %v with a candidate queued, want about 250 ms", d)
	}
	g := <-won
	if g == nil {
		return
	}
	l, err := e.Leader(ctx)
	if err != nil || string(l.Value) != "cand" || l.Term != g.Token() || g.Token() <= mg.Token() {
		t.Fatalf("Leader %+v %v, grant %d, mutex %d", l, err, g.Token(), mg.Token())
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// TestCampaignCancelLeavesNothing: a Campaign that gives up, and one whose
// session is destroyed while it waits, leave nothing in Consul; the leader
// is unaffected.
func TestCampaignCancelLeavesNothing(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 20*time.Second)
	g, err := newElection(t, newSession(t, c, WithLockDelay(0)), name).Campaign(ctx, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := newElection(t, newSession(t, c, WithLockDelay(0)), name).Campaign(cctx, []byte("two")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign: %v, want DeadlineExceeded", err)
	}
	waitFor(t, 2*time.Second, "the candidate's queue key removed", func() bool { return len(contenderKeys(t, c, name)) == 1 })
	s3 := newSession(t, c, WithLockDelay(0))
	done := make(chan error, 1)
	go func() { _, err := newElection(t, s3, name).Campaign(ctx, []byte("three")); done <- err }()
	waitFor(t, 5*time.Second, "the candidate queued", func() bool { return queueLen(t, c, name) == 1 })
	destroy(t, c, s3.ID())
	if err := <-done; !errors.Is(err, holdfast.ErrSessionLost) {
		t.Fatalf("Campaign of a destroyed session: %v", err)
	}
	waitFor(t, 2*time.Second, "the destroyed candidate's queue key removed", func() bool { return len(contenderKeys(t, c, name)) == 1 })
	if g.Context().Err() != nil {
		t.Fatal("the leader's context ended")
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// TestObserveEndsWithSession: Observe's channel is closed when the session
// ends.
func TestObserveEndsWithSession(t *testing.T) {
	a := agent(t)
	c := a.Client(t)
	s := newSession(t, c, WithLockDelay(0))
	obs := newElection(t, s, uniqueName(t)).Observe(context.Background())
	if l := nextLeader(t, obs, 5*time.Second); !l.None() {
		t.Fatalf("first: %+v, want no leader", l)
	}
	_ = s.Close()
	select {
	case _, ok := <-obs:
		if ok {
			t.Fatal("a change after the session closed")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Observe's channel not closed with the session")
	}
}

// TestObserveRefusedEnds: a blocking query Consul refuses (HTTP 403: the
// token may not read the key) ends Observe, as it ends a Lock's wait
// (Session.block): the channel closes at once. Before, Observe retried the
// refusal until ctx ended, delivering nothing.
func TestObserveRefusedEnds(t *testing.T) {
	a := embedtest.Consul(t, embedtest.WithACL())
	admin := a.Client(t)
	tok := policyToken(t, admin, "other-only", `session_prefix "" { policy = "write" } key_prefix "other/" { policy = "write" }`)
	s, err := Dial(timeout(t, 10*time.Second), a.HTTPAddr, WithToken(tok), WithLockDelay(0))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer s.Close()
	octx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obs := newElection(t, s, "jobs/leader").Observe(octx)
	select {
	case l, ok := <-obs:
		if ok {
			t.Fatalf("Observe delivered %+v from a refused query", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Observe still open 5 s after Consul refused its query")
	}
}
