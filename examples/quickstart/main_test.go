package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// TestReadmeShowsThisCode: every "README: x" section of main.go stands in
// README.md as written, so the README's example compiles and runs.
func TestReadmeShowsThisCode(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(string(src), "// README: ")
	n := 0
	for _, part := range parts[1:] {
		name, code, _ := strings.Cut(part, "\n")
		if name == "end" {
			continue
		}
		n++
		if code = strings.TrimSpace(code); !strings.Contains(string(readme), code) {
			t.Errorf("README.md does not show the %q section of examples/quickstart/main.go as written:\n%s", name, code)
		}
	}
	if n != 3 {
		t.Fatalf("found %d README sections in main.go, want 3", n)
	}
}

// TestRun runs the example against real servers and checks the records the
// guarded writes left.
func TestRun(t *testing.T) {
	c := embedtest.Etcd(t)
	a := embedtest.Consul(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, c.Endpoint(0), a.HTTPAddr); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Client(t).Get(ctx, "reports/last")
	if err != nil || len(resp.Kvs) != 1 || !strings.HasPrefix(string(resp.Kvs[0].Value), "done under token ") {
		t.Errorf("etcd reports/last = %v, %v", resp, err)
	}
	kv, _, err := a.Client(t).KV().Get("reports/last", (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || kv == nil || !strings.HasPrefix(string(kv.Value), "done under token ") {
		t.Errorf("consul reports/last = %v, %v", kv, err)
	}
	for _, name := range []string{"locks/nightly-report/", "locks/cleanup/"} {
		if resp, err := c.Client(t).Get(ctx, name, clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 0 {
			t.Errorf("etcd keys left under %s: %v %v", name, resp, err)
		}
	}
}
