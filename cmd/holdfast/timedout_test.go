package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/holdfast/holdfast/embedtest"
)

// latency is holdAnswer's: a store 100 ms away.
const latency = 100 * time.Millisecond

// holdAnswer is an HTTP proxy to a Consul agent, latency away, that passes
// every request on (unless its client went meanwhile) and holds the answer
// of the nth request for which match is true until the client gives up on
// it (the request itself reaches the store); every other request is
// answered as the store answers it.
type holdAnswer struct {
	target string
	match  func(r *http.Request) bool
	nth    int
	mu     sync.Mutex
	seen   int
	held   chan struct{} // closed when the held answer came
}

func startHoldAnswer(t *testing.T, target string, nth int, match func(*http.Request) bool) (addr string, h *holdAnswer) {
	t.Helper()
	h = &holdAnswer{target: target, match: match, nth: nth, held: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), h
}

func (h *holdAnswer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hold := false
	if h.match(r) {
		h.mu.Lock()
		h.seen++
		hold = h.seen == h.nth
		h.mu.Unlock()
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	ctx := r.Context()
	select { // the store's distance: a request whose client went meanwhile is not sent
	case <-time.After(latency):
	case <-ctx.Done():
		return
	}
	if hold { // the request applies whatever the client does
		ctx = context.WithoutCancel(ctx)
	}
	out, err := http.NewRequestWithContext(ctx, r.Method, "http://"+h.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if hold {
		close(h.held)
		<-r.Context().Done() // the client gave up
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// TestTimedOutCloseConsul: a once or lock --try whose attempt times out
// because one answer is held (the claim session's creation; the acquiring
// transaction), every other request being answered, exits 125 within its
// bound and leaves its main session ("holdfast") destroyed, as the once
// help promises. Before, the session's close was not waited for after a
// timed-out --try attempt (or any once): holdfast exited before the
// destroy went out and the session stayed listed until its TTL.
func TestTimedOutCloseConsul(t *testing.T) {
	holdfastBin(t)
	a := embedtest.Consul(t)
	c := a.Client(t)
	put := func(path string) func(*http.Request) bool {
		return func(r *http.Request) bool { return r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, path) }
	}
	for _, tc := range []struct {
		name  string
		match func(*http.Request) bool
		nth   int
		args  []string
		bound time.Duration // the attempt's bound
	}{
		{"once", put("/v1/session/create"), 2, []string{"once", "-v", "--every", "1h", "--timeout", "1500ms", "--ttl", "10s", "tc/once", "--", "sh", "-c", "echo RAN"}, 1500 * time.Millisecond},
		{"lock-try", put("/v1/txn"), 1, []string{"lock", "-v", "--try", "--ttl", "10s", "tc/trylk", "--", "echo", "ran"}, tryBound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _, err := c.Session().List(nil)
			if err != nil {
				t.Fatal(err)
			}
			addr, h := startHoldAnswer(t, a.HTTPAddr, tc.nth, tc.match)
			p := start(t, append([]string{tc.args[0], "--backend", "consul", "--addr", addr}, tc.args[1:]...)...)
			code := p.wait(t, 20*time.Second)
			t.Logf("exit %d after %v; stderr: %q", code, p.took.Round(time.Millisecond), p.stderr.String())
			select {
			case <-h.held:
			default:
				t.Fatalf("no answer was held: the test did not do what it means to")
			}
			if code != exitFailed {
				t.Errorf("exit %d, want %d", code, exitFailed)
			}
			if strings.Contains(p.stdout.String(), "RAN") || strings.Contains(p.stdout.String(), "ran") {
				t.Errorf("CMD ran: stdout %q", p.stdout.String())
			}
			// The attempt's bound, plus lostCloseTimeout for the close,
			// plus the process's start and exit.
			if max := tc.bound + lostCloseTimeout + time.Second; p.took > max {
				t.Errorf("exit after %v, want within %v", p.took, max)
			}
			all, _, err := c.Session().List(nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range all {
				if strings.HasPrefix(s.Name, "holdfast ") && !slices.ContainsFunc(before, func(b *api.SessionEntry) bool { return b.ID == s.ID }) {
					t.Errorf("holdfast's session %s left after it exited (until its TTL)", s.ID)
				}
			}
		})
	}
}

// TestNoProbeWhileCommandRuns: the late probe of a bounded attempt (a read
// of the bare name, lateProbe before the bound) is for an attempt that
// still waits: once the lock is granted it is called off, so a CMD that
// runs past the attempt's bound sees no stray read of holdfast's. Before,
// the probe's timer stayed armed and its read went out while CMD ran.
func TestNoProbeWhileCommandRuns(t *testing.T) {
	holdfastBin(t)
	a := embedtest.Consul(t)
	probe := func(r *http.Request) bool { return r.Method == http.MethodGet && r.URL.Path == "/v1/kv/tc/noprobe" }
	addr, h := startHoldAnswer(t, a.HTTPAddr, 0, probe) // counts, holds nothing
	p := start(t, "lock", "--backend", "consul", "--addr", addr, "--timeout", "1s", "--ttl", "10s", "tc/noprobe", "--", "sleep", "1.5")
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, p.stderr.String())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen != 0 {
		t.Errorf("%d probe reads of the name while CMD ran (the lock was granted well within --timeout)", h.seen)
	}
}
