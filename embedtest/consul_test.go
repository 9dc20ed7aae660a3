package embedtest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/embedtest/internal/testserver"
)

func TestConsul(t *testing.T) {
	if _, err := ConsulBinary(); err != nil { // may build Consul once (minutes)
		t.Fatal(err)
	}
	start := time.Now()
	a := Consul(t)
	t.Logf("consul start: %v (%s)", time.Since(start), a.HTTPAddr)
	// Ready means a session can be created at once (issue 25, defect 8: an
	// agent refuses one for a moment after it elects itself), and the
	// readiness probe's session is gone.
	if id, _, err := a.Client(t).Session().Create(&api.SessionEntry{TTL: "10s", Checks: []string{}}, nil); err != nil {
		t.Fatalf("create a session right after start: %v", err)
	} else if _, err := a.Client(t).Session().Destroy(id, nil); err != nil {
		t.Fatal(err)
	}
	if list, _, err := a.Client(t).Session().List(nil); err != nil || len(list) != 0 {
		t.Fatalf("sessions left by the readiness probe: %v, %v", list, err)
	}
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
	before := testserver.StableGoroutines()
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
	if after := testserver.SettledGoroutines(before); after > before {
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

func Example() {
	a, err := StartConsul()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	cli, err := a.NewClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := cli.KV().Put(&api.KVPair{Key: "greeting", Value: []byte("hello")}, nil); err != nil {
		fmt.Println(err)
		return
	}
	kv, _, err := cli.KV().Get("greeting", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(kv.Value))
	// Output: hello
}
