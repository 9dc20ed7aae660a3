package consul

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-cleanhttp"

	"github.com/holdfast/holdfast/embedtest"
)

// cleanupBound bounds how long the session takes to remove what a failed
// Lock or an unconfirmed Unlock left, once Consul is reachable again: the
// attempt under way when Consul froze ends within core.AttemptTimeout (2 s)
// and the next one follows after a pause of at most 1 s; with a paused (not
// blackholed) proxy, the attempt under way usually completes at once.
const cleanupBound = 3500 * time.Millisecond

// shared is the agent most tests share (lock names are unique per test).
var shared struct {
	once  sync.Once
	agent *embedtest.ConsulAgent
	err   error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.agent != nil {
		shared.agent.Close()
	}
	os.Exit(code)
}

// agent returns the shared Consul agent, starting it on first use.
func agent(t testing.TB) *embedtest.ConsulAgent {
	t.Helper()
	shared.once.Do(func() { shared.agent, shared.err = embedtest.StartConsul() })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.agent
}

// uniqueName returns a fresh lock name for the test.
func uniqueName(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "test/" + strings.ReplaceAll(t.Name(), "/", "-") + "/" + hex.EncodeToString(b[:])
}

// newSession creates a session closed with the test.
func newSession(t testing.TB, c *api.Client, opts ...SessionOption) *Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := NewSession(ctx, c, opts...)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newMutex returns a Mutex or fails the test.
func newMutex(t testing.TB, s *Session, name string) *Mutex {
	t.Helper()
	m, err := NewMutex(s, name)
	if err != nil {
		t.Fatalf("NewMutex(%q): %v", name, err)
	}
	return m
}

// keys lists every key under name + "/".
func keys(t testing.TB, c *api.Client, name string) []string {
	t.Helper()
	ks, _, err := c.KV().Keys(name+"/", "", nil)
	if err != nil {
		t.Fatalf("list keys under %s/: %v", name, err)
	}
	slices.Sort(ks)
	return ks
}

// contenderKeys lists the keys under name + "/" as one key per contender,
// as on etcd: the lock key, and the entries of the waiters. While the lock
// key is held, the holder's entry and marks and the tail key are its
// holder's bookkeeping and left out; the links and anchors under waiters'
// entries always are. With the lock key free or absent, every key shows
// (a leftover of a released grant would).
func contenderKeys(t testing.TB, c *api.Client, name string) []string {
	t.Helper()
	pairs, _, err := c.KV().List(name+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	holders := map[string]string{} // lock name -> holding session
	for _, p := range pairs {
		if n, ok := strings.CutSuffix(p.Key, lockSuffix); ok && p.Session != "" {
			holders[n] = p.Session
		}
	}
	var ks []string
	for _, p := range pairs {
		n, rest, inQueue := strings.Cut(p.Key, queueInfix)
		session, _, child := strings.Cut(rest, "/")
		tailOf, isTail := strings.CutSuffix(p.Key, tailSuffix)
		switch {
		case isTail && holders[tailOf] != "":
		case inQueue && (child || session == holders[n]):
		default:
			ks = append(ks, p.Key)
		}
	}
	slices.Sort(ks)
	return ks
}

// queueLen counts the queue entries of the Mutex called name.
func queueLen(t testing.TB, c *api.Client, name string) int {
	t.Helper()
	pairs, _, err := c.KV().List(name+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	holder := ""
	for _, p := range pairs {
		if p.Key == LockKey(name) {
			holder = p.Session
		}
	}
	n := 0
	for _, p := range pairs {
		id, ok := strings.CutPrefix(p.Key, name+queueInfix)
		if ok && id != "" && !strings.Contains(id, "/") && p.Session != "" && p.Session != holder {
			n++ // a waiter's entry (the holder's stays while it holds)
		}
	}
	return n
}

// destroy destroys a session through c, as Consul would invalidate it.
func destroy(t testing.TB, c *api.Client, id string) {
	t.Helper()
	if _, err := c.Session().Destroy(id, nil); err != nil {
		t.Fatalf("destroy session %s: %v", id, err)
	}
}

// timeout returns a context bounded by d and by the test.
func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond every 5 ms up to d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// counter counts the HTTP requests of a client.
type counter struct {
	base http.RoundTripper
	n    atomic.Int64
}

func (c *counter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.base.RoundTrip(r)
}

// countingClient returns a client of a whose requests are counted.
func countingClient(t testing.TB, a *embedtest.ConsulAgent) (*api.Client, *counter) {
	t.Helper()
	tr := cleanhttp.DefaultPooledTransport()
	t.Cleanup(tr.CloseIdleConnections)
	cnt := &counter{base: tr}
	c, err := a.NewClient(func(cfg *api.Config) { cfg.HttpClient = &http.Client{Transport: cnt} })
	if err != nil {
		t.Fatal(err)
	}
	return c, cnt
}

// proxied returns a fault proxy to the agent and a client that goes
// through it.
func proxied(t testing.TB, a *embedtest.ConsulAgent) (*embedtest.Proxy, *api.Client) {
	t.Helper()
	p := embedtest.StartProxy(t, a.HTTPAddr)
	c, err := a.NewClient(func(cfg *api.Config) { cfg.Address = p.Addr() })
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

// isCtx reports whether err is a context error.
func isCtx(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
