//go:build !race

package consul

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

var debugClient *api.Client

// semRun is what one side of TestSemaphoreVersusAPI measured.
type semRun struct {
	acquisitions int64
	seconds      float64
	requests     int64 // every HTTP request, blocking queries included
	fairness     float64
	violations   int64 // moments with more than limit holders
	peak         int64
}

// add adds o's counts to r (fairness: the lowest; peak: the highest).
func (r *semRun) add(o semRun) {
	if r.seconds == 0 || o.fairness < r.fairness {
		r.fairness = o.fairness
	}
	r.acquisitions += o.acquisitions
	r.seconds += o.seconds
	r.requests += o.requests
	r.violations += o.violations
	r.peak = max(r.peak, o.peak)
}

func (r semRun) String() string {
	return fmt.Sprintf("%6d acquisitions, %7.1f acq/s, %5.2f requests/acq, fairness %.3f, violations %d (peak %d holders)",
		r.acquisitions, float64(r.acquisitions)/r.seconds, float64(r.requests)/float64(max(r.acquisitions, 1)), r.fairness, r.violations, r.peak)
}

// jain is Jain's fairness index of xs: 1 when all are equal.
func jain(xs []int64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// TestSemaphoreVersusAPI measures, in the same run, holdfast's Semaphore
// and api.Semaphore with limit 4 and 32 contenders that hold for 0 (issue 8's
// targets: >= 5x the acquisitions per second, <= 8 HTTP requests per
// acquisition, every request counted, fairness >= 0.9, no moment with more
// than 4 holders). HOLDFAST_SEM_SECONDS sets each side's duration (default
// 3). It fails on violations or more than 8 requests per acquisition; the
// other figures are printed (a loaded 2-core box moves them), with
// holdfast's requests per acquisition by kind for each round.
func TestSemaphoreVersusAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	const limit, contenders = 4, 32
	d := 6 * time.Second
	if s, err := strconv.Atoi(os.Getenv("HOLDFAST_SEM_SECONDS")); err == nil && s > 0 {
		d = time.Duration(s) * time.Second
	}
	// Alternate short rounds, so that both sides see the same load on a
	// shared machine.
	var hf, ap semRun
	for range 3 {
		hf.add(runHoldfastSem(t, nil, limit, contenders, d/3))
		ap.add(runAPISem(t, nil, limit, contenders, d/3))
	}
	t.Logf("limit %d, %d contenders, hold 0, %v each in 3 alternating rounds:", limit, contenders, d)
	t.Logf("  holdfast Semaphore: %v", hf)
	t.Logf("  api.Semaphore:      %v", ap)
	ratio := (float64(hf.acquisitions) / hf.seconds) / max(float64(ap.acquisitions)/ap.seconds, 1e-9)
	t.Logf("  holdfast/api acquisitions per second: %.1fx", ratio)
	if hf.violations != 0 || ap.violations != 0 {
		t.Errorf("violations: holdfast %d, api %d", hf.violations, ap.violations)
	}
	if r := float64(hf.requests) / float64(max(hf.acquisitions, 1)); r > 8 {
		t.Errorf("holdfast: %.2f requests per acquisition, want <= 8", r)
	}
}

func runHoldfastSem(t *testing.T, a interface {
	NewClient(...func(*api.Config)) (*api.Client, error)
}, limit, n int, d time.Duration) semRun {
	c, cnt := countingClient(t, agent(t))
	if debugClient != nil {
		c = debugClient
	}
	kinds := &kindCounter{base: cnt.base, n: map[string]int64{}}
	cnt.base = kinds
	name := uniqueName(t) + "/hf"
	sems := make([]*Semaphore, n)
	for i := range sems {
		sems[i] = newSemaphore(t, newSession(t, c), name, limit)
	}
	h := &holders{limit: int64(limit)}
	counts := make([]int64, n)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	cnt.n.Store(0)
	start := time.Now()
	for i, m := range sems {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				g, err := m.Lock(ctx)
				if err != nil {
					if ctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				h.in()
				counts[i]++
				runtime.Gosched()
				h.out()
				if err := g.Unlock(context.Background()); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	r := semRun{seconds: time.Since(start).Seconds(), requests: cnt.n.Load(), violations: h.viol.Load(), peak: h.peak.Load()}
	for _, x := range counts {
		r.acquisitions += x
	}
	r.fairness = jain(counts)
	kinds.log(t, r.acquisitions)
	return r
}

func runAPISem(t *testing.T, _ any, limit, n int, d time.Duration) semRun {
	c, cnt := countingClient(t, agent(t))
	prefix := uniqueName(t) + "/api"
	sems := make([]*api.Semaphore, n)
	for i := range sems {
		id, _, err := c.Session().Create(&api.SessionEntry{TTL: "15s", Behavior: api.SessionBehaviorDelete}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = c.Session().Destroy(id, nil) })
		if sems[i], err = c.SemaphoreOpts(&api.SemaphoreOptions{Prefix: prefix, Limit: limit, Session: id}); err != nil {
			t.Fatal(err)
		}
	}
	h := &holders{limit: int64(limit)}
	counts := make([]int64, n)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	cnt.n.Store(0)
	start := time.Now()
	time.AfterFunc(d, func() { close(stop) })
	for i, m := range sems {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lost, err := m.Acquire(stop)
				if err != nil {
					t.Error(err)
					return
				}
				if lost == nil {
					return // stopped
				}
				h.in()
				counts[i]++
				runtime.Gosched()
				h.out()
				if err := m.Release(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	r := semRun{seconds: time.Since(start).Seconds(), requests: cnt.n.Load(), violations: h.viol.Load(), peak: h.peak.Load()}
	for _, x := range counts {
		r.acquisitions += x
	}
	r.fairness = jain(counts)
	return r
}

// kindCounter counts a client's requests per kind (see requestKind).
type kindCounter struct {
	base http.RoundTripper
	mu   sync.Mutex
	n    map[string]int64
}

func (k *kindCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	kind := requestKind(r)
	k.mu.Lock()
	k.n[kind]++
	k.mu.Unlock()
	return k.base.RoundTrip(r)
}

// log logs the requests per acquisition of each kind, most first.
func (k *kindCounter) log(t *testing.T, acquisitions int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	names := slices.SortedFunc(maps.Keys(k.n), func(x, y string) int { return cmp.Compare(k.n[y], k.n[x]) })
	var b strings.Builder
	for _, kind := range names {
		fmt.Fprintf(&b, "\n    %5.2f  %s", float64(k.n[kind])/float64(max(acquisitions, 1)), kind)
	}
	t.Logf("requests per acquisition by kind (%d acquisitions):%s", acquisitions, b.String())
}

// requestKind names a request: a transaction by its operations (verb, and
// @lock for the lock key), a KV read by whether it blocks and recurses.
func requestKind(r *http.Request) string {
	q := r.URL.Query()
	switch {
	case r.URL.Path == "/v1/txn" && r.Body != nil:
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var ops []struct{ KV struct{ Verb, Key string } }
		_ = json.Unmarshal(body, &ops)
		var parts []string
		for _, op := range ops {
			part := op.KV.Verb
			if strings.HasSuffix(op.KV.Key, "/.lock") {
				part += "@lock"
			}
			if n := len(parts); n > 0 && strings.TrimRight(parts[n-1], "*") == part {
				parts[n-1] = part + "*"
				continue
			}
			parts = append(parts, part)
		}
		return "txn " + strings.Join(parts, ",")
	case strings.HasPrefix(r.URL.Path, "/v1/kv/"):
		kind := r.Method + " kv"
		if q.Has("recurse") {
			kind += " list"
		}
		if q.Has("index") {
			kind += " blocking"
		}
		return kind
	}
	path := strings.Split(r.URL.Path, "/") // without an ID: /v1/session/renew
	return r.Method + " " + strings.Join(path[:min(len(path), 4)], "/")
}

// TestPermitWaitersLeaveCost: 16 waiters of a held limit-1 semaphore give
// up at once; each leave costs its read and its transaction, at most 3
// requests per waiter in all. Before, every leave also rewrote the lock key
// by CAS, so the 16 leaves raced for it and read and wrote again
// (5.6-6.5 requests per waiter).
func TestPermitWaitersLeaveCost(t *testing.T) {
	const n = 16
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	g, err := newSemaphore(t, newSession(t, admin), name, 1).Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = g.Unlock(timeout(t, 5*time.Second)) }()
	c, cnt := countingClient(t, a)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		m := newSemaphore(t, newSession(t, c), name, 1)
		wg.Go(func() { _, _ = m.Lock(ctx) })
	}
	waitFor(t, 5*time.Second, "every waiter queued", func() bool { return len(keys(t, admin, name)) == n+2 })
	time.Sleep(100 * time.Millisecond) // every waiter in its blocking read
	cnt.n.Store(0)
	cancel()
	wg.Wait()
	waitFor(t, cleanupBound, "only the holder's keys left", func() bool { return len(keys(t, admin, name)) == 2 })
	time.Sleep(100 * time.Millisecond)
	per := float64(cnt.n.Load()) / n
	t.Logf("%d waiters left: %.2f requests per waiter", n, per)
	if per > 3 {
		t.Errorf("%.2f requests per leaving waiter, want <= 3", per)
	}
}
