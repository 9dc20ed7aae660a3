package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/leader"
)

var _ leader.Candidate[*etcd.Grant] = (*etcd.Election)(nil)

func newElection(t *testing.T, s *etcd.Session, name string) *etcd.Election {
	t.Helper()
	e, err := etcd.NewElection(s, name)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// next receives from ch within bound, or fails t.
func next(t *testing.T, ch <-chan holdfast.Leader, bound time.Duration) holdfast.Leader {
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
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	s := newSession(t, c, etcd.WithTTL(5*time.Second))
	e := newElection(t, s, "svc/leader")
	ctx := context.Background()
	if _, err := e.Leader(ctx); !errors.Is(err, holdfast.ErrNoLeader) {
		t.Fatalf("Leader with no candidate: %v, want ErrNoLeader", err)
	}
	if err := e.Proclaim(ctx, []byte("x")); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("Proclaim before Campaign: %v, want ErrNotHeld", err)
	}
	if err := e.Resign(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("Resign before Campaign: %v, want ErrNotHeld", err)
	}
	g, err := e.Campaign(ctx, []byte("a:1"))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("svc/leader/%x", int64(s.Lease())); g.Key() != want {
		t.Fatalf("key %q, want %q (concurrency.Election layout)", g.Key(), want)
	}
	resp, err := cli.Get(ctx, g.Key())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "a:1" || resp.Kvs[0].Lease != int64(s.Lease()) {
		t.Fatalf("leader key: %v %v", resp, err)
	}
	l, err := e.Leader(ctx)
	if err != nil || l.Key != g.Key() || string(l.Value) != "a:1" || l.Term != g.Token() || holdfast.Token(resp.Kvs[0].CreateRevision) != g.Token() {
		t.Fatalf("Leader %+v %v, grant %s %d", l, err, g.Key(), g.Token())
	}
	if err := e.Proclaim(ctx, []byte("a:2")); err != nil {
		t.Fatal(err)
	}
	l, err = e.Leader(ctx)
	if err != nil || string(l.Value) != "a:2" || l.Term != g.Token() {
		t.Fatalf("after Proclaim: %+v %v (term must stay %d)", l, err, g.Token())
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if context.Cause(g.Context()) != holdfast.ErrReleased {
		t.Fatalf("grant cause after Resign: %v", context.Cause(g.Context()))
	}
	if _, err := e.Leader(ctx); !errors.Is(err, holdfast.ErrNoLeader) {
		t.Fatalf("Leader after Resign: %v, want ErrNoLeader", err)
	}
	if err := e.Resign(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("second Resign: %v, want ErrNotHeld", err)
	}
	if err := e.Proclaim(ctx, []byte("x")); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("Proclaim after Resign: %v, want ErrNotHeld", err)
	}
	if ks := keys(t, cli, "svc/leader/"); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
	if _, err := etcd.NewElection(nil, "x"); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Fatalf("nil session: %v", err)
	}
	if _, err := etcd.NewElection(s, "/bad"); !errors.Is(err, holdfast.ErrInvalidName) {
		t.Fatalf("bad name: %v", err)
	}
}

// replace deletes key and puts it again, with the value "impostor".
func replace(t *testing.T, cli *clientv3.Client, key string) {
	t.Helper()
	if _, err := cli.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(context.Background(), key, "impostor"); err != nil {
		t.Fatal(err)
	}
}

// TestProclaimGuarded: a Proclaim after the leader's key was deleted and
// put again by another client writes nothing.
func TestProclaimGuarded(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	s := newSession(t, c, etcd.WithTTL(5*time.Second))
	e := newElection(t, s, "svc/proclaim")
	ctx := context.Background()
	g, err := e.Campaign(ctx, []byte("mine"))
	if err != nil {
		t.Fatal(err)
	}
	replace(t, cli, g.Key())
	err = e.Proclaim(ctx, []byte("overwrite"))
	if !errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("Proclaim on a replaced key: %v, want ErrNotHeld", err)
	}
	resp, err := cli.Get(ctx, g.Key())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "impostor" {
		t.Fatalf("replaced key was overwritten: %v %v", resp.Kvs, err)
	}
}

// TestProclaimGuardedUnnoticed: a Proclaim while the grant does not know yet
// that its key was replaced (the session's watch is cut) must be refused by
// etcd, not applied.
func TestProclaimGuardedUnnoticed(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	s, p := proxiedSession(t, c, etcd.WithTTL(5*time.Second))
	e := newElection(t, s, "svc/proclaim2")
	ctx := context.Background()
	g, err := e.Campaign(ctx, []byte("mine"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the grant is watched
	p.Pause()
	replace(t, cli, g.Key())
	done := make(chan error, 1)
	go func() { done <- e.Proclaim(ctx, []byte("overwrite")) }()
	time.Sleep(50 * time.Millisecond)
	p.Mend()
	if err := <-done; err == nil {
		// the watch may have won the race after Mend: only a success is wrong
		t.Fatal("Proclaim on a replaced key succeeded")
	}
	resp, err := cli.Get(ctx, g.Key())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "impostor" {
		t.Fatalf("replaced key was overwritten: %v %v", resp.Kvs, err)
	}
}

// TestElectionInterop: holdfast and concurrency.Election on one name, both
// directions: campaign order is respected and every side sees the same
// leader, through Leader and Observe.
func TestElectionInterop(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "svc/interop"
	hs := newSession(t, c, etcd.WithTTL(5*time.Second))
	he := newElection(t, hs, name)
	cs, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ce := concurrency.NewElection(cs, name)
	obs := he.Observe(ctx)
	if l := next(t, obs, 5*time.Second); !l.None() {
		t.Fatalf("first Observe: %+v, want no leader", l)
	}
	cobs := ce.Observe(ctx)

	// concurrency first, holdfast waits behind it.
	if err := ce.Campaign(ctx, "native"); err != nil {
		t.Fatal(err)
	}
	l := next(t, obs, 5*time.Second)
	if string(l.Value) != "native" || l.Term != holdfast.Token(ce.Rev()) || l.Key != ce.Key() {
		t.Fatalf("holdfast Observe: %+v, want concurrency's leader %s@%d", l, ce.Key(), ce.Rev())
	}
	if hl, err := he.Leader(ctx); err != nil || hl.Key != ce.Key() {
		t.Fatalf("holdfast Leader: %+v %v", hl, err)
	}
	if r := <-cobs; string(r.Kvs[0].Value) != "native" {
		t.Fatalf("concurrency Observe: %q", r.Kvs[0].Value)
	}
	won := make(chan *etcd.Grant, 1)
	go func() {
		g, err := he.Campaign(ctx, []byte("holdfast"))
		if err != nil {
			t.Error(err)
		}
		won <- g
	}()
	waitQueued(t, cli, name, 2)
	select {
	case <-won:
		t.Fatal("holdfast won while concurrency.Election leads")
	case <-time.After(200 * time.Millisecond):
	}
	if err := ce.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	g := <-won
	if g == nil {
		return
	}
	// Between concurrency's resignation and holdfast taking office (its
	// value written), there is no leader: holdfast's Observe may say so,
	// and concurrency's may show holdfast's key with an empty value.
	l = next(t, obs, 5*time.Second)
	if l.None() {
		l = next(t, obs, 5*time.Second)
	}
	if l.Key != g.Key() || l.Term != g.Token() || string(l.Value) != "holdfast" {
		t.Fatalf("holdfast Observe after handover: %+v, want %s@%d", l, g.Key(), g.Token())
	}
	r := <-cobs
	if len(r.Kvs[0].Value) == 0 && r.Kvs[0].CreateRevision == int64(g.Token()) {
		r = <-cobs
	}
	if string(r.Kvs[0].Value) != "holdfast" || r.Kvs[0].CreateRevision != int64(g.Token()) {
		t.Fatalf("concurrency Observe: %q@%d", r.Kvs[0].Value, r.Kvs[0].CreateRevision)
	}
	if r, err := ce.Leader(ctx); err != nil || string(r.Kvs[0].Key) != g.Key() {
		t.Fatalf("concurrency Leader: %v %v", r, err)
	}

	// holdfast first, concurrency waits behind it.
	cwon := make(chan error, 1)
	go func() { cwon <- ce.Campaign(ctx, "native2") }()
	waitQueued(t, cli, name, 2)
	select {
	case err := <-cwon:
		t.Fatalf("concurrency won while holdfast leads: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := he.Proclaim(ctx, []byte("holdfast2")); err != nil {
		t.Fatal(err)
	}
	if r := <-cobs; string(r.Kvs[0].Value) != "holdfast2" {
		t.Fatalf("concurrency Observe of Proclaim: %q", r.Kvs[0].Value)
	}
	if l := next(t, obs, 5*time.Second); string(l.Value) != "holdfast2" || l.Term != g.Token() {
		t.Fatalf("holdfast Observe of Proclaim: %+v", l)
	}
	if err := he.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-cwon; err != nil {
		t.Fatal(err)
	}
	if l := next(t, obs, 5*time.Second); l.Key != ce.Key() || string(l.Value) != "native2" || l.Term != holdfast.Token(ce.Rev()) || l.Term <= g.Token() {
		t.Fatalf("holdfast Observe: %+v, want %s@%d", l, ce.Key(), ce.Rev())
	}
	if err := ce.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if l := next(t, obs, 5*time.Second); !l.None() {
		t.Fatalf("Observe after the last resign: %+v, want no leader", l)
	}
}

// TestObserveEveryLeader: Observe delivers every leader in order, with
// "no leader" between them, even for a reader that starts late and reads
// slowly, and across many quick failovers (some by lease revocation, which
// deletes a key in the same revision as others).
func TestObserveEveryLeader(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const name = "svc/every"
	obsSession := newSession(t, c, etcd.WithTTL(5*time.Second))
	obs := newElection(t, obsSession, name).Observe(ctx)
	if l := next(t, obs, 5*time.Second); !l.None() {
		t.Fatalf("first: %+v", l)
	}
	var want []holdfast.Leader
	for i := range 20 {
		s := newSession(t, c, etcd.WithTTL(5*time.Second))
		e := newElection(t, s, name)
		g, err := e.Campaign(ctx, fmt.Appendf(nil, "v%d", i))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, holdfast.Leader{Key: g.Key(), Value: fmt.Appendf(nil, "v%d", i), Term: g.Token()})
		if i%2 == 0 {
			if err := e.Resign(ctx); err != nil {
				t.Fatal(err)
			}
		} else if _, err := cli.Revoke(ctx, s.Lease()); err != nil {
			t.Fatal(err)
		}
		want = append(want, holdfast.Leader{})
	}
	for i, w := range want { // read only now: every change was buffered
		l := next(t, obs, 5*time.Second)
		if !l.None() || !w.None() {
			if l.Key != w.Key || l.Term != w.Term || string(l.Value) != string(w.Value) {
				t.Fatalf("change %d: %+v, want %+v", i, l, w)
			}
		} else if !l.None() {
			t.Fatalf("change %d: %+v, want no leader", i, l)
		}
	}
	select {
	case l := <-obs:
		t.Fatalf("extra change: %+v", l)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	for range obs { // closed with ctx
	}
}

// TestObserveCompaction: an Observe whose watch starts from a compacted
// revision reads the keys again and goes on delivering changes.
func TestObserveCompaction(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "svc/compact"
	s := newSession(t, c, etcd.WithTTL(5*time.Second))
	e := newElection(t, s, name)
	g1, err := e.Campaign(ctx, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Put(ctx, "other", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	used := observeFromOnce(1) // compacted: the watch is cancelled at once
	obs := newElection(t, newSession(t, c, etcd.WithTTL(5*time.Second)), name).Observe(ctx)
	if l := next(t, obs, 5*time.Second); l.Term != g1.Token() {
		t.Fatalf("first: %+v", l)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if l := next(t, obs, 5*time.Second); !l.None() {
		t.Fatalf("after resign: %+v, want no leader", l)
	}
	g2, err := e.Campaign(ctx, []byte("two"))
	if err != nil {
		t.Fatal(err)
	}
	if l := next(t, obs, 5*time.Second); l.Term != g2.Token() || string(l.Value) != "two" {
		t.Fatalf("after campaign: %+v, want term %d", l, g2.Token())
	}
	if !used() {
		t.Fatal("the watch did not start from the compacted revision: the test tested nothing")
	}
}

// TestCampaignCancelLeavesNothing: a Campaign that gives up leaves no key,
// and a waiter whose lease is revoked never becomes leader.
func TestCampaignCancelLeavesNothing(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	const name = "svc/cancel"
	ctx := context.Background()
	s1 := newSession(t, c, etcd.WithTTL(5*time.Second))
	g, err := newElection(t, s1, name).Campaign(ctx, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	s2 := newSession(t, c, etcd.WithTTL(5*time.Second))
	cctx, ccancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer ccancel()
	if _, err := newElection(t, s2, name).Campaign(cctx, []byte("two")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign: %v, want DeadlineExceeded", err)
	}
	waitFor(t, 2*time.Second, "the waiter's key removed", func() bool { return len(keys(t, cli, name+"/")) == 1 })

	s3 := newSession(t, c, etcd.WithTTL(5*time.Second))
	done := make(chan error, 1)
	go func() { _, err := newElection(t, s3, name).Campaign(ctx, []byte("three")); done <- err }()
	waitQueued(t, cli, name, 2)
	if _, err := cli.Revoke(ctx, s3.Lease()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, holdfast.ErrSessionLost) && !errors.Is(err, holdfast.ErrLost) {
		t.Fatalf("Campaign of a revoked lease: %v", err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, cli, name+"/"); len(ks) != 0 {
		t.Fatalf("keys left: %v", ks)
	}
}

// TestObserveEndsWithSession: Observe's channel is closed when the session
// ends, and at once for a nil context.
func TestObserveEndsWithSession(t *testing.T) {
	c := etcdtest.Etcd(t)
	s := newSession(t, c, etcd.WithTTL(5*time.Second))
	e := newElection(t, s, "svc/ends")
	obs := e.Observe(context.Background())
	next(t, obs, 5*time.Second)
	_ = s.Close()
	select {
	case _, ok := <-obs:
		if ok {
			t.Fatal("a change after the session closed")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Observe's channel not closed with the session")
	}
	//lint:ignore SA1012 a nil context is the input under test
	if _, ok := <-e.Observe(nil); ok { //nolint:staticcheck
		t.Fatal("Observe(nil) delivered")
	}
}
