package embedtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
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
	before := stableGoroutines()

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
	if after := settledGoroutines(before); after > before {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before, %d after\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

// stableGoroutines waits (at most 5 s) until the goroutine count has not
// changed for 300 ms and returns it.
func stableGoroutines() int {
	deadline := time.Now().Add(5 * time.Second)
	n, since := runtime.NumGoroutine(), time.Now()
	for time.Since(since) < 300*time.Millisecond && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if m := runtime.NumGoroutine(); m != n {
			n, since = m, time.Now()
		}
	}
	return n
}

// settledGoroutines waits (at most 5 s) for the goroutine count to drop to
// target and returns the count.
func settledGoroutines(target int) int {
	deadline := time.Now().Add(5 * time.Second)
	n := runtime.NumGoroutine()
	for n > target && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
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

func TestConsul(t *testing.T) {
	if _, err := ConsulBinary(); err != nil { // may build Consul once (minutes)
		t.Fatal(err)
	}
	start := time.Now()
	a := Consul(t)
	t.Logf("consul start: %v (%s)", time.Since(start), a.HTTPAddr)
	if a.MgmtToken != "" {
		t.Errorf("MgmtToken = %q without ACL", a.MgmtToken)
	}
	cli := a.Client(t)

	// KV put/get.
	kv := cli.KV()
	if _, err := kv.Put(&api.KVPair{Key: "holdfast/k", Value: []byte("v")}, nil); err != nil {
		t.Fatal(err)
	}
	p, _, err := kv.Get("holdfast/k", &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatal(err)
	}
	if p == nil || string(p.Value) != "v" {
		t.Fatalf("Get = %+v", p)
	}
	// The readiness probe left nothing behind.
	if keys, _, err := kv.Keys("holdfast-embedtest", "", nil); err != nil || len(keys) != 0 {
		t.Errorf("readiness key left behind: %v %v", keys, err)
	}

	// A session with LockDelay 0 needs the raw HTTP API (the api package
	// omits a zero LockDelay and the server then applies 15 s).
	req, err := http.NewRequest("PUT", "http://"+a.HTTPAddr+"/v1/session/create",
		strings.NewReader(`{"Name":"embedtest","TTL":"10s","LockDelay":"0s","Behavior":"delete"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("session create: %s %s", resp.Status, body)
	}
	sessions, _, err := cli.Session().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(sessions) != 1 || sessions[0].LockDelay != 0 || sessions[0].TTL != "10s" || sessions[0].Behavior != "delete" {
		t.Fatalf("sessions = %+v", sessions)
	}
	// The session acquires and releases a key.
	ok, _, err := kv.Acquire(&api.KVPair{Key: "holdfast/lock/.lock", Session: sessions[0].ID}, nil)
	if err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}

	start = time.Now()
	a.Close()
	a.Close()
	t.Logf("consul close: %v", time.Since(start))
	if _, err := os.Stat(a.dir); !os.IsNotExist(err) {
		t.Errorf("agent dir %s not removed: %v", a.dir, err)
	}
	if _, _, err := kv.Get("holdfast/k", nil); err == nil {
		t.Error("Get after Close succeeded")
	}
}

func TestConsulACL(t *testing.T) {
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	start := time.Now()
	a := Consul(t, WithACL())
	t.Logf("consul start with ACL: %v", time.Since(start))
	if len(a.MgmtToken) != 36 {
		t.Fatalf("MgmtToken = %q", a.MgmtToken)
	}

	anon, err := a.NewClient(func(c *api.Config) { c.Token = "" })
	if err != nil {
		t.Fatal(err)
	}
	_, err = anon.KV().Put(&api.KVPair{Key: "holdfast/denied", Value: []byte("x")}, nil)
	var se api.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusForbidden {
		t.Fatalf("anonymous Put: err = %v, want a 403 StatusError", err)
	}

	mgmt := a.Client(t)
	if _, err := mgmt.KV().Put(&api.KVPair{Key: "holdfast/allowed", Value: []byte("x")}, nil); err != nil {
		t.Fatalf("management Put: %v", err)
	}
	p, _, err := mgmt.KV().Get("holdfast/allowed", nil)
	if err != nil || p == nil || string(p.Value) != "x" {
		t.Fatalf("management Get = %+v, %v", p, err)
	}
	// The anonymous token cannot read it either.
	if p, _, err := anon.KV().Get("holdfast/allowed", nil); err == nil && p != nil {
		t.Fatalf("anonymous Get = %+v", p)
	}
}

func TestConsulBinaryEnv(t *testing.T) {
	t.Setenv("CONSUL_BIN", "/nonexistent/consul")
	if _, err := ConsulBinary(); err == nil || !strings.Contains(err.Error(), "CONSUL_BIN") {
		t.Fatalf("ConsulBinary with a bad CONSUL_BIN: %v", err)
	}
	if a, err := StartConsul(); err == nil {
		a.Close()
		t.Fatal("StartConsul with a bad CONSUL_BIN succeeded")
	}
}

func TestConsulNoLeak(t *testing.T) {
	// Warm up (builds or finds the binary).
	if _, err := ConsulBinary(); err != nil {
		t.Fatal(err)
	}
	before := stableGoroutines()
	a, err := StartConsul(WithACL())
	if err != nil {
		t.Fatal(err)
	}
	cli, err := a.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.KV().Put(&api.KVPair{Key: "k"}, nil); err != nil {
		t.Fatal(err)
	}
	pid := a.cmd.Process.Pid
	a.Close()
	if after := settledGoroutines(before); after > before {
		t.Errorf("goroutines: %d before, %d after", before, after)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil && runtime.GOOS == "linux" {
		t.Errorf("consul process %d still exists", pid)
	}
}

func TestConsulStartFailure(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "consul")
	script := "#!/bin/sh\necho 'fake consul: boom' >&2\nexit 3\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CONSUL_BIN", bin)
	start := time.Now()
	a, err := StartConsul()
	if err == nil {
		a.Close()
		t.Fatal("StartConsul with a failing binary succeeded")
	}
	if !strings.Contains(err.Error(), "fake consul: boom") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("error lacks the agent's output: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("failure took %v", d)
	}
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
	p, err := freePorts(1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer releasePorts(p)
	m.peerURL = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", p[0])}
	e, err := embed.StartEtcd(c.config(m, "m0="+m.peerURL.String()))
	if err == nil {
		e.Close()
		t.Fatal("StartEtcd on a taken port succeeded")
	}
	if !isAddrInUse(err) {
		t.Fatalf("isAddrInUse(%v) = false", err)
	}
}

// TestPortsBelowEphemeralRange: ports handed out are never in the range the
// kernel uses for outgoing connections, so a stopped member's port cannot be
// taken by a client connection before it restarts.
func TestPortsBelowEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	ps, err := freePorts(50, true)
	if err != nil {
		t.Fatal(err)
	}
	defer releasePorts(ps)
	seen := map[int]bool{}
	for _, p := range ps {
		if p < portRangeLow || p >= lo {
			t.Errorf("port %d outside [%d, %d)", p, portRangeLow, lo)
		}
		if seen[p] {
			t.Errorf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
