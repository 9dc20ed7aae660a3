package etcd_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/etcd"
)

// blackholeProxy starts a TCP proxy to the etcd endpoint whose traffic can be
// dropped in both directions, as in a network partition.
func blackholeProxy(t *testing.T, endpoint string) proxy.Server {
	t.Helper()
	to, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	from := l.Addr().String()
	_ = l.Close()
	p := proxy.NewServer(proxy.ServerConfig{
		Logger: zap.NewNop(),
		From:   url.URL{Scheme: "tcp", Host: from},
		To:     url.URL{Scheme: "tcp", Host: to.Host},
	})
	select {
	case <-p.Ready():
	case err := <-p.Error():
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("proxy not ready")
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestPartitionedHolderToldFirst cuts a holder off from etcd. Its lease then
// expires on the server and a waiter is granted the lock; the holder's grant
// context must be cancelled before that grant.
func TestPartitionedHolderToldFirst(t *testing.T) {
	c := embedtest.Etcd(t)
	p := blackholeProxy(t, c.Endpoint(0))
	holderCli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"http://" + p.From()[len("tcp://"):]},
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer holderCli.Close()
	ctx := context.Background()
	hs, err := etcd.NewSession(ctx, holderCli, etcd.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer hs.Close()
	hm, _ := etcd.NewMutex(hs, "partition")
	g, err := hm.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wm := newMutex(t, newSession(t, c, etcd.WithTTL(3*time.Second)), "partition")

	toldFirst(t, g, wm, 15*time.Second, func() {
		p.BlackholeTx()
		p.BlackholeRx()
	})
}

// toldFirst cuts a holder off with cut, then waits (at most timeout) until
// waiter is granted the lock, and checks that the holder's grant context was
// cancelled, for a lost session, before that grant, and that the new token is
// higher.
func toldFirst(t *testing.T, g holdfast.Grant, waiter *etcd.Mutex, timeout time.Duration, cut func()) {
	t.Helper()
	var mu sync.Mutex
	var toldAt time.Time
	go func() {
		<-g.Context().Done()
		mu.Lock()
		toldAt = time.Now()
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
	if !errors.Is(context.Cause(g.Context()), holdfast.ErrSessionLost) {
		t.Fatalf("cause %v, want ErrSessionLost", context.Cause(g.Context()))
	}
	if wg.Token() <= g.Token() {
		t.Fatalf("new token %d not above old %d", wg.Token(), g.Token())
	}
	t.Logf("holder told %v after the cut, waiter granted %v after (lead %v)", toldAt.Sub(cutAt), grantedAt.Sub(cutAt), grantedAt.Sub(toldAt))
}

// TestClusterLeaderFailover keeps a lock usable across the loss of the etcd
// leader in a three-member cluster: a waiter queued before the failure is
// granted after it, the holder's guarded write works, and exclusion holds.
func TestClusterLeaderFailover(t *testing.T) {
	c := embedtest.EtcdCluster(t, 3)
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
	c := embedtest.EtcdCluster(t, 3)
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
	toldFirst(t, g, wm, 20*time.Second, func() { c.CutPeer(isolated) })
}
