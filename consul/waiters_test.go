package consul

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-cleanhttp"
)

// byteCounter counts a client's HTTP requests and the bytes of their
// response bodies.
type byteCounter struct {
	base            http.RoundTripper
	requests, bytes *atomic.Int64
}

func (c byteCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	resp, err := c.base.RoundTrip(r)
	if resp != nil && resp.Body != nil {
		resp.Body = countedBody{resp.Body, c.bytes}
	}
	return resp, err
}

type countedBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// waitersCost is what measureWaiters found: HTTP requests and response
// bytes per acquisition, every request of every contender counted (blocking
// queries and the sessions' own included).
type waitersCost struct {
	waiters         int
	acquisitions    int64
	requests, bytes float64 // per acquisition
	seconds         float64
}

func (c waitersCost) String() string {
	return fmt.Sprintf("%4d waiters: %5d acquisitions, %5.2f requests/acq, %7.0f bytes/acq, %.1f s",
		c.waiters, c.acquisitions, c.requests, c.bytes, c.seconds)
}

// measureWaiters runs waiters+1 contenders on one lock, each with its own
// client and session, each locking again as soon as it unlocks (hold 0), so
// that waiters of them always wait while one holds. Counting starts once
// all the waiters have queued behind the first holder, and stops after acqs
// acquisitions.
func measureWaiters(t *testing.T, waiters int, acqs int64) waitersCost {
	t.Helper()
	n := waiters + 1
	a := agent(t)
	name := uniqueName(t) + fmt.Sprintf("/n%d", n)
	var requests, bytes atomic.Int64
	tr := cleanhttp.DefaultPooledTransport()
	tr.MaxIdleConnsPerHost = 4 * n
	t.Cleanup(tr.CloseIdleConnections)
	ms := make([]*Mutex, n)
	var wg sync.WaitGroup
	var setupErr atomic.Value
	sem := make(chan struct{}, 16)
	for i := range ms {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := a.NewClient(func(cfg *api.Config) {
				cfg.HttpClient = &http.Client{Transport: byteCounter{base: tr, requests: &requests, bytes: &bytes}}
			})
			if err != nil {
				setupErr.Store(err)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := NewSession(ctx, c, WithLockDelay(0), WithTTL(time.Hour))
			if err != nil {
				setupErr.Store(err)
				return
			}
			t.Cleanup(func() { _ = s.Close() })
			ms[i], err = NewMutex(s, name)
			if err != nil {
				setupErr.Store(err)
			}
		}()
	}
	wg.Wait()
	if err, ok := setupErr.Load().(error); ok {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	first, err := ms[0].Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var (
		done   atomic.Int64
		result waitersCost
		once   sync.Once
		start  time.Time
	)
	stop := func() {
		once.Do(func() {
			result = waitersCost{waiters: waiters, acquisitions: done.Load(), seconds: time.Since(start).Seconds()}
			result.requests = float64(requests.Load()) / float64(result.acquisitions)
			result.bytes = float64(bytes.Load()) / float64(result.acquisitions)
			cancel()
		})
	}
	loop := func(m *Mutex, g *Grant) {
		defer wg.Done()
		for {
			if g != nil {
				if done.Add(1) == acqs {
					stop()
				}
				if err := g.Unlock(context.Background()); err != nil {
					t.Error(err)
					return
				}
			}
			var err error
			if g, err = m.Lock(ctx); err != nil {
				if ctx.Err() == nil {
					t.Error(err)
					stop()
				}
				return
			}
		}
	}
	for _, m := range ms[1:] {
		wg.Add(1)
		go loop(m, nil)
	}
	c := a.Client(t)
	waitFor(t, 2*time.Minute, "every waiter queued", func() bool { return queueLen(t, c, name) == waiters })
	time.Sleep(100 * time.Millisecond) // the waiters' first blocking queries
	requests.Store(0)
	bytes.Store(0)
	start = time.Now()
	wg.Add(1)
	go loop(ms[0], first)
	wg.Wait()
	if ctx.Err() == nil || result.acquisitions == 0 {
		t.Fatalf("%d waiters: the run ended before %d acquisitions", n, acqs)
	}
	return result
}

// TestWaitersCost measures the requests and response bytes per acquisition
// with 2, 16 and 128 waiters on one lock (512 in TestWaitersCostFlat512,
// without -race).
func TestWaitersCost(t *testing.T) {
	for _, n := range []int{2, 16, 128} {
		t.Log(measureWaiters(t, n, int64(max(200, 2*n))))
	}
}
