package etcd_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// TestPartitionedHolderToldFirst cuts a holder off from etcd. Its lease then
// expires on the server and a waiter is granted the lock; the holder's grant
// context must be cancelled before that grant.
func TestPartitionedHolderToldFirst(t *testing.T) {
	c := etcdtest.Etcd(t)
	ctx := context.Background()
	hs, p := proxiedSession(t, c, etcd.WithTTL(3*time.Second))
	g, err := newMutex(t, hs, "partition").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wm := newMutex(t, newSession(t, c, etcd.WithTTL(3*time.Second)), "partition")
	toldFirst(t, g, wm, 3*time.Second, 15*time.Second, p.Blackhole)
}

// toldFirst cuts a holder (session TTL ttl, default margin TTL/5) off with
// cut, then waits (at most timeout) until waiter is granted the lock. It
// checks that the holder's grant context was cancelled, for a lost session,
// before that grant, and no later than TTL - margin after its last
// acknowledged renewal (seen from outside as the moment its Deadline last
// moved): that is what the margin is for, so WithMargin(0) fails here. The
// new token must be higher.
func toldFirst(t *testing.T, g *etcd.Grant, waiter *etcd.Mutex, ttl, timeout time.Duration, cut func()) {
	t.Helper()
	var mu sync.Mutex
	var toldAt, renewedAt time.Time
	d := g.Deadline()
	waitFor(t, ttl, "a renewal", func() bool { return g.Deadline().After(d) })
	go func() { // poll: the moment the deadline moves is when a renewal is acknowledged
		last := g.Deadline()
		renewed := time.Now()
		for g.Context().Err() == nil {
			if d := g.Deadline(); d.After(last) {
				last, renewed = d, time.Now()
			}
			time.Sleep(time.Millisecond)
		}
		mu.Lock()
		toldAt, renewedAt = time.Now(), renewed
		mu.Unlock()
	}()
	cut()
	cutAt := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	wg, err := waiter.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	grantedAt := time.Now()
	defer wg.Unlock(context.Background())
	mu.Lock()
	defer mu.Unlock()
	if toldAt.IsZero() || !toldAt.Before(grantedAt) {
		t.Fatalf("holder told at %v, waiter granted at %v (after the cut)", toldAt.Sub(cutAt), grantedAt.Sub(cutAt))
	}
	// The last acknowledged renewal was sent a round trip before its
	// acknowledgement was seen; with WithMargin(0) the holder would be told
	// about TTL/5 later than this bound.
	if bound := ttl - ttl/5 + 150*time.Millisecond; toldAt.Sub(renewedAt) > bound {
		t.Fatalf("holder told %v after its last acknowledged renewal, later than TTL - margin (+ slack) = %v", toldAt.Sub(renewedAt), bound)
	}
	if !errors.Is(context.Cause(g.Context()), holdfast.ErrSessionLost) {
		t.Fatalf("cause %v, want ErrSessionLost", context.Cause(g.Context()))
	}
	if wg.Token() <= g.Token() {
		t.Fatalf("new token %d not above old %d", wg.Token(), g.Token())
	}
	t.Logf("holder told %v after the cut (%v after its last acknowledged renewal), waiter granted %v after the cut (lead %v)",
		toldAt.Sub(cutAt), toldAt.Sub(renewedAt), grantedAt.Sub(cutAt), grantedAt.Sub(toldAt))
}

// TestClusterLeaderFailover keeps a lock usable across the loss of the etcd
// leader in a three-member cluster: a waiter queued before the failure is
// granted after it, the holder's guarded write works, and exclusion holds.
func TestClusterLeaderFailover(t *testing.T) {
	c := etcdtest.EtcdCluster(t, 3)
	ctx := context.Background()
	a := newMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), "failover")
	b := newMutex(t, newSession(t, c, etcd.WithTTL(5*time.Second)), "failover")
	ga, err := a.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan holdfast.Grant, 1)
	errc := make(chan error, 1)
	go func() {
		g, err := b.Lock(ctx)
		if err != nil {
			errc <- err
			return
		}
		got <- g
	}()
	time.Sleep(200 * time.Millisecond)
	leader := c.Leader()
	if leader < 0 {
		t.Fatal("no leader")
	}
	if err := c.Stop(leader); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := ga.Txn(tctx, clientv3.OpPut("failover-data", "a")); err != nil {
		t.Fatalf("guarded write after failover: %v", err)
	}
	select {
	case g := <-got:
		t.Fatalf("b granted %v while a holds", g.Token())
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	if err := ga.Unlock(tctx); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-got:
		if g.Token() <= ga.Token() {
			t.Fatalf("token regressed: %d then %d", ga.Token(), g.Token())
		}
		if err := g.Unlock(tctx); err != nil {
			t.Fatal(err)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not granted after failover")
	}
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
}

// TestIsolatedMemberHolderToldFirst: in a three-member cluster, the holder
// talks only to one member, which is then cut off from its peers. Its
// keepalives fail (no leader), the lease expires on the majority side and a
// waiter there is granted the lock; the holder must be told first.
func TestIsolatedMemberHolderToldFirst(t *testing.T) {
	c := etcdtest.EtcdCluster(t, 3)
	ctx := context.Background()
	leader, err := c.WaitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	isolated := (leader + 1) % 3 // a follower
	holderCli := c.Client(t, func(cfg *clientv3.Config) { cfg.Endpoints = []string{c.Endpoint(isolated)} })
	hs, err := etcd.NewSession(ctx, holderCli, etcd.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer hs.Close()
	hm, _ := etcd.NewMutex(hs, "isolated")
	g, err := hm.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	others := []string{c.Endpoint(leader), c.Endpoint((leader + 2) % 3)}
	waiterCli := c.Client(t, func(cfg *clientv3.Config) { cfg.Endpoints = others })
	ws, err := etcd.NewSession(ctx, waiterCli, etcd.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	wm, _ := etcd.NewMutex(ws, "isolated")

	defer c.MendPeer(isolated)
	toldFirst(t, g, wm, 3*time.Second, 20*time.Second, func() { c.CutPeer(isolated) })
}

// TestSessionGrantAnswerLost: a session whose lease grant applied without
// an answer takes that lease on the retry (its ID is chosen by holdfast),
// instead of a second one: no lease but the session's while it is open,
// none after Close.
func TestSessionGrantAnswerLost(t *testing.T) {
	c := etcdtest.Etcd(t)
	f := etcdtest.NewFaults()
	cli := c.Client(t, f.Install)
	hit := f.Inject(etcdtest.Rule{Method: "/etcdserverpb.Lease/LeaseGrant", Mode: etcdtest.LoseAnswer})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := etcd.NewSession(ctx, cli)
	if !hit() {
		t.Fatal("the fault did not hit the lease grant")
	}
	if err != nil {
		t.Fatalf("NewSession with the grant's answer lost: %v", err)
	}
	admin := c.Client(t)
	leases, err := admin.Leases(ctx)
	if err != nil || len(leases.Leases) != 1 || leases.Leases[0].ID != s.Lease() {
		t.Errorf("leases %v (%v): want the session's %x alone", leases, err, int64(s.Lease()))
	}
	if _, err := newMutex(t, s, "grantlost").Lock(ctx); err != nil {
		t.Errorf("Lock on the session: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if leases, err := admin.Leases(ctx); err != nil || len(leases.Leases) != 0 {
		t.Errorf("leases after Close: %v (%v), want none", leases, err)
	}
}
