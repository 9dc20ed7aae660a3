package etcdtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/holdfast/holdfast/embedtest/internal/testserver"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestEtcdSingle(t *testing.T) {
	start := time.Now()
	c, err := StartEtcd(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1-node start: %v", time.Since(start))
	defer c.Close()
	if got := c.Leader(); got != 0 {
		t.Fatalf("Leader() = %d, want 0", got)
	}
	if eps := c.Endpoints(); len(eps) != 1 || eps[0] != c.Endpoint(0) {
		t.Fatalf("Endpoints() = %v, Endpoint(0) = %q", eps, c.Endpoint(0))
	}
	cli, err := c.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 10*time.Second)
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	r, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("Get = %v", r.Kvs)
	}
	// A lease at the server's minimum TTL.
	l, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if l.TTL != 2 {
		t.Errorf("Grant(1).TTL = %d, want the 2 s minimum", l.TTL)
	}
	// An open watch must not make Stop slow.
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	wch := cli.Watch(wctx, "k")
	if _, err := cli.Put(ctx, "k", "v2"); err != nil {
		t.Fatal(err)
	}
	<-wch
	start = time.Now()
	if err := c.Stop(0); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop with an open watch: %v", time.Since(start))
	if eps := c.Endpoints(); len(eps) != 0 {
		t.Errorf("Endpoints() after Stop = %v", eps)
	}
	if c.Leader() != -1 {
		t.Errorf("Leader() after Stop = %d", c.Leader())
	}
	wcancel()
	cli.Close()
	start = time.Now()
	c.Close()
	c.Close()
	t.Logf("close: %v", time.Since(start))
}

func TestEtcdBadInput(t *testing.T) {
	for _, n := range []int{0, -1, 17} {
		if c, err := StartEtcd(t.TempDir(), n); err == nil {
			c.Close()
			t.Errorf("StartEtcd(%d) succeeded", n)
		}
	}
	c := Etcd(t)
	for _, i := range []int{-1, 1, 99} {
		if err := c.Stop(i); err == nil {
			t.Errorf("Stop(%d) succeeded", i)
		}
		if err := c.Restart(i); err == nil {
			t.Errorf("Restart(%d) succeeded", i)
		}
		if ep := c.Endpoint(i); ep != "" {
			t.Errorf("Endpoint(%d) = %q", i, ep)
		}
		c.CutPeer(i)
		c.MendPeer(i)
	}
	if err := c.Restart(0); err == nil {
		t.Error("Restart of a running member succeeded")
	}
	c.Close()
	if _, err := c.NewClient(); err == nil {
		t.Error("NewClient on a closed cluster succeeded")
	}
	if err := c.Restart(0); err == nil {
		t.Error("Restart on a closed cluster succeeded")
	}
	if err := c.Stop(0); err != nil {
		t.Errorf("Stop on a closed cluster: %v", err)
	}
}

func TestEtcdCluster3(t *testing.T) {
	start := time.Now()
	c := EtcdCluster(t, 3)
	t.Logf("3-node start: %v", time.Since(start))
	cli := c.Client(t)
	ctx := ctxT(t, 60*time.Second)

	leader := c.Leader()
	if leader < 0 {
		t.Fatal("no leader after start")
	}
	if _, err := cli.Put(ctx, "a", "1"); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	if err := c.Stop(leader); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop leader %d: %v", leader, time.Since(start))
	nl, err := c.WaitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if nl == leader {
		t.Fatalf("leader is still the stopped member %d", nl)
	}
	t.Logf("new leader %d after %v", nl, time.Since(start))
	if len(c.Endpoints()) != 2 {
		t.Fatalf("Endpoints() = %v", c.Endpoints())
	}
	if _, err := cli.Put(ctx, "a", "2"); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart: %v", time.Since(start))
	// The restarted member catches up and serves linearizable reads.
	one, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Endpoint(leader)}, DialTimeout: 5 * time.Second, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	r, err := one.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "2" {
		t.Fatalf("restarted member Get = %v", r.Kvs)
	}
}

func TestEtcdCutPeer(t *testing.T) {
	c := EtcdCluster(t, 3)
	ctx := ctxT(t, 60*time.Second)
	leader, err := c.WaitLeader(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	follower := (leader + 1) % 3

	// A client of the follower alone.
	fc := c.Client(t, func(cfg *clientv3.Config) { cfg.Endpoints = []string{c.Endpoint(follower)} })
	if _, err := fc.Put(ctx, "x", "1"); err != nil {
		t.Fatal(err)
	}

	c.CutPeer(follower)
	// The majority still writes.
	cli := c.Client(t, func(cfg *clientv3.Config) {
		cfg.Endpoints = []string{c.Endpoint(leader), c.Endpoint((leader + 2) % 3)}
	})
	if _, err := cli.Put(ctx, "x", "2"); err != nil {
		t.Fatal(err)
	}
	// The cut follower can neither write nor serve a linearizable read.
	sctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	_, err = fc.Get(sctx, "x")
	cancel()
	if err == nil {
		t.Fatal("linearizable Get on a cut follower succeeded")
	}
	// A serializable read shows its stale state.
	r, err := fc.Get(ctx, "x", clientv3.WithSerializable())
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Kvs[0].Value) != "1" {
		t.Fatalf("cut follower has x=%s, want the stale 1", r.Kvs[0].Value)
	}
	if l := c.Leader(); l == follower {
		t.Fatalf("cut follower became leader")
	}

	c.MendPeer(follower)
	// After mending it catches up.
	deadline := time.Now().Add(10 * time.Second)
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		r, err := fc.Get(sctx, "x")
		cancel()
		if err == nil && string(r.Kvs[0].Value) == "2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mended follower did not catch up: %v %v", r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := fc.Put(ctx, "x", "3"); err != nil {
		t.Fatal(err)
	}
}

// TestEtcdCutRestart restarts a cut member: it stays cut until mended.
func TestEtcdCutRestart(t *testing.T) {
	c := EtcdCluster(t, 3)
	ctx := ctxT(t, 60*time.Second)
	leader, err := c.WaitLeader(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := (leader + 1) % 3
	c.CutPeer(f)
	if err := c.Stop(f); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client(t).Put(ctx, "y", "1"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Restart(f); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Restart of a cut member took %v", d)
	}
	fc := c.Client(t, func(cfg *clientv3.Config) { cfg.Endpoints = []string{c.Endpoint(f)} })
	sctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	_, err = fc.Get(sctx, "y")
	cancel()
	if err == nil {
		t.Fatal("linearizable Get on a restarted cut member succeeded")
	}
	c.MendPeer(f)
	deadline := time.Now().Add(10 * time.Second)
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		r, err := fc.Get(sctx, "y")
		cancel()
		if err == nil && len(r.Kvs) == 1 && string(r.Kvs[0].Value) == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mended member did not catch up: %v %v", r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestEtcdNoLeak checks that a started and closed cluster leaves no
// goroutines behind.
func TestEtcdNoLeak(t *testing.T) {
	// Warm up once-only globals (loggers, grpc, metrics).
	c, err := StartEtcd("", 1)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := c.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	cli.Close()
	c.Close()
	before := testserver.StableGoroutines()

	c, err = StartEtcd("", 3)
	if err != nil {
		t.Fatal(err)
	}
	cli, err = c.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctxT(t, 10*time.Second), "k", "v"); err != nil {
		t.Fatal(err)
	}
	cli.Close()
	c.Close()
	if after := testserver.SettledGoroutines(before); after > before {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before, %d after\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

func Example() {
	c, err := StartEtcd("", 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	cli, err := c.NewClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	if _, err := cli.Put(context.Background(), "greeting", "hello"); err != nil {
		fmt.Println(err)
		return
	}
	r, err := cli.Get(context.Background(), "greeting")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(r.Kvs[0].Value))
	// Output: hello
}

// TestEtcdBindRace checks that a port taken by someone else is recognised as
// such (StartEtcd and Restart retry on it).
func TestEtcdBindRace(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := &Cluster{token: "t"}
	m := &member{name: "m0", dir: filepath.Join(t.TempDir(), "m0")}
	m.clientURL = url.URL{Scheme: "http", Host: l.Addr().String()}
	p, err := testserver.FreePorts(1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer testserver.ReleasePorts(p)
	m.peerURL = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", p[0])}
	e, err := embed.StartEtcd(c.config(m, "m0="+m.peerURL.String()))
	if err == nil {
		e.Close()
		t.Fatal("StartEtcd on a taken port succeeded")
	}
	if !testserver.IsAddrInUse(err) {
		t.Fatalf("testserver.IsAddrInUse(%v) = false", err)
	}
}
