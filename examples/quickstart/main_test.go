package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/embedtest/leakcheck"
	"github.com/holdfast/holdfast/etcd"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// TestReadmeShowsThisCode: every "README: x" section of this package's
// files stands in README.md as written, and every Go snippet of README.md is
// one of them, so the README's Go compiles (and TestRun runs most of it).
func TestReadmeShowsThisCode(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var sections []string
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, part := range strings.Split(string(src), "// README: ")[1:] {
			name, code, _ := strings.Cut(part, "\n")
			if name == "end" {
				continue
			}
			code = strings.TrimSpace(code)
			sections = append(sections, code)
			if !strings.Contains(string(readme), code) {
				t.Errorf("README.md does not show the %q section of examples/quickstart/%s as written:\n%s", name, file, code)
			}
		}
	}
	snippets := strings.Split(string(readme), "```go\n")[1:]
	for _, snippet := range snippets {
		snippet, _, _ = strings.Cut(snippet, "```")
		snippet = strings.TrimSpace(snippet)
		if strings.Contains(snippet, "\npackage main\n") {
			continue // Getting started's program: tests/gettingstarted builds and runs it
		}
		if !slices.ContainsFunc(sections, func(s string) bool { return strings.Contains(s, snippet) }) {
			t.Errorf("a Go snippet of README.md is in no README section of examples/quickstart, so nothing compiles it:\n%s", snippet)
		}
	}
	if len(snippets) < 8 {
		t.Errorf("found %d Go snippets in README.md, want at least 8", len(snippets))
	}
}

// TestRun runs the example against real servers and checks the records the
// guarded writes left.
func TestRun(t *testing.T) {
	c := etcdtest.Etcd(t)
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
	// The other primitives' snippets.
	var mu sync.Mutex
	var now, most, done int
	encode := func(ctx context.Context, file string) error {
		mu.Lock()
		now++
		most = max(most, now)
		mu.Unlock()
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		now--
		done++
		mu.Unlock()
		return nil
	}
	if err := encodeAll(ctx, c.Endpoints(), []string{"a", "b", "c", "d", "e", "f"}, encode); err != nil {
		t.Fatal(err)
	}
	if done != 6 || most != 2 {
		t.Errorf("encodeAll: %d files done, at most %d at once; want 6, 2 (two sessions, so two holders)", done, most)
	}
	s, err := etcd.Dial(ctx, c.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The wrong shape, as the README warns: goroutines sharing one session
	// take turns, whatever the limit.
	sem, err := etcd.NewSemaphore(s, "jobs/shared", 3)
	if err != nil {
		t.Fatal(err)
	}
	most, done = 0, 0
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			g, err := sem.Lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			_ = encode(ctx, "x")
			_ = g.Unlock(ctx)
		})
	}
	wg.Wait()
	if most != 1 {
		t.Errorf("3 goroutines on one session, limit 3: %d at once, want 1", most)
	}
	var tokens []holdfast.Token
	note := func(ctx context.Context, token holdfast.Token) error {
		tokens = append(tokens, token)
		return ctx.Err()
	}
	if err := updateRoutes(ctx, s, note, note); err != nil || len(tokens) != 2 || tokens[0] == 0 || tokens[1] != tokens[0] {
		t.Errorf("updateRoutes: %v, tokens %v: want the write grant's token kept by the read grant", err, tokens)
	}
	if err := lead(ctx, s, note); err != nil || len(tokens) != 3 || tokens[2] <= tokens[1] {
		t.Errorf("lead: %v, tokens %v", err, tokens)
	}
	for _, name := range []string{"locks/nightly-report/", "locks/cleanup/", "jobs/encoders/", "config/routes/", "services/scheduler/", "jobs/shared/"} {
		if resp, err := c.Client(t).Get(ctx, name, clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 0 {
			t.Errorf("etcd keys left under %s: %v %v", name, resp, err)
		}
	}
}
