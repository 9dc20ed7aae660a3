package embedtest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-cleanhttp"
)

// FaultMode is what FaultTransport does to a request it faults.
type FaultMode int

const (
	// FaultRefuse answers HTTP 500 without forwarding the request: the
	// store refused it before applying it (as a Consul agent does for a
	// moment after a leader change).
	FaultRefuse FaultMode = iota + 1
	// FaultLoseAnswer forwards the request, waits for the store's answer,
	// drops it and returns an error: the request was applied, and the
	// caller does not know.
	FaultLoseAnswer
	// FaultLate holds the request until the caller's context ends, returns
	// the context's error to the caller, and forwards the request Late
	// later in the background: a request applied after its caller gave up
	// (a slow link, a frozen agent that resumes).
	FaultLate
)

// String names the mode, for test names.
func (m FaultMode) String() string {
	switch m {
	case FaultRefuse:
		return "refused"
	case FaultLoseAnswer:
		return "answer-lost"
	case FaultLate:
		return "late"
	}
	return "none"
}

// FaultModes lists every FaultMode.
var FaultModes = []FaultMode{FaultRefuse, FaultLoseAnswer, FaultLate}

// ErrFaultInjected is the error a faulted request returns (FaultLoseAnswer);
// a FaultRefuse answer is an HTTP 500 whose body names it.
var ErrFaultInjected = errors.New("embedtest: fault injected")

// FaultMatch selects requests: the HTTP method, the URL path
// ("/v1/txn", "/v1/kv/<key>", ...) and the request body.
type FaultMatch func(method, path string, body []byte) bool

// Fault is one armed fault of a FaultTransport (see Inject).
type Fault struct {
	match FaultMatch
	nth   int // the matching request to fault, counted from 1
	mode  FaultMode
	// Late is how long a FaultLate request waits after its caller's context
	// ended before it is forwarded, and Refusal the body of a FaultRefuse
	// answer ("" for a generic one; "No cluster leader", say, for one that
	// Consul sends): set them before the request comes.
	Late    time.Duration
	Refusal string

	seen  int           // matching requests so far (under the transport's mu)
	fired chan struct{} // closed when the fault hit a request
	done  chan struct{} // closed when the faulted request has played out
	// Path and Body are the faulted request's, once Fired is closed.
	Path string
	Body []byte
}

// Fired is closed when the fault has hit its request.
func (f *Fault) Fired() <-chan struct{} { return f.fired }

// Done is closed when the faulted request has played out: refused, its
// lost answer received, or (FaultLate) forwarded and answered.
func (f *Fault) Done() <-chan struct{} { return f.done }

// FaultTransport is an http.RoundTripper for Consul API clients
// (api.Config's HttpClient: &http.Client{Transport: t}) that
// forwards every request to Base, except the ones an armed Fault selects,
// which it faults once each (see FaultMode). Observe, if set, sees every
// request (method, path, body) before it is matched. Methods are safe for
// concurrent use; Close waits for the late requests still held.
type FaultTransport struct {
	// Base carries the requests (nil: a pooled cleanhttp transport made on
	// first use, closed by Close).
	Base http.RoundTripper
	// Observe, if set, is called for every request, before matching.
	Observe func(method, path string, body []byte)

	mu     sync.Mutex
	faults []*Fault
	own    *http.Transport
	closed chan struct{}
	late   sync.WaitGroup
}

// Inject arms a fault: the nth request (from 1) matching m from now on
// gets mode. It returns the fault, to wait for it (Fired, Done) and to set
// its Late delay.
func (t *FaultTransport) Inject(m FaultMatch, nth int, mode FaultMode) *Fault {
	f := &Fault{match: m, nth: max(nth, 1), mode: mode, fired: make(chan struct{}), done: make(chan struct{})}
	t.mu.Lock()
	t.faults = append(t.faults, f)
	t.mu.Unlock()
	return f
}

// Disarm removes the faults that have not fired yet.
func (t *FaultTransport) Disarm() {
	t.mu.Lock()
	t.faults = nil
	t.mu.Unlock()
}

// Close disarms every fault, forwards the late requests still held at once,
// waits for their answers and closes the idle connections of its own Base.
func (t *FaultTransport) Close() {
	t.mu.Lock()
	t.faults = nil
	t.init()
	select {
	case <-t.closed:
	default:
		close(t.closed)
	}
	own := t.own
	t.mu.Unlock()
	t.late.Wait()
	if own != nil {
		own.CloseIdleConnections()
	}
}

// init makes the base transport and the closed channel (t.mu held).
func (t *FaultTransport) init() {
	if t.closed == nil {
		t.closed = make(chan struct{})
	}
	if t.Base == nil {
		t.own = cleanhttp.DefaultPooledTransport()
		t.Base = t.own
	}
}

// RoundTrip forwards r, or faults it.
func (t *FaultTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		var err error
		body, err = io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	t.mu.Lock()
	t.init()
	base, closed, observe := t.Base, t.closed, t.Observe
	var f *Fault
	for i, c := range t.faults {
		if !c.match(r.Method, r.URL.Path, body) {
			continue
		}
		if c.seen++; c.seen == c.nth {
			f = c
			t.faults = append(t.faults[:i:i], t.faults[i+1:]...)
			break
		}
	}
	if f != nil && f.mode == FaultLate {
		t.late.Add(1)
	}
	t.mu.Unlock()
	if observe != nil {
		observe(r.Method, r.URL.Path, body)
	}
	if f == nil {
		return base.RoundTrip(r)
	}
	f.Path, f.Body = r.URL.Path, body
	close(f.fired)
	switch f.mode {
	case FaultRefuse:
		defer close(f.done)
		return &http.Response{
			Status: "500 Internal Server Error", StatusCode: http.StatusInternalServerError,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{},
			Body:    io.NopCloser(strings.NewReader(cmp.Or(f.Refusal, ErrFaultInjected.Error()+": refused before applied"))),
			Request: r,
		}, nil
	case FaultLoseAnswer:
		defer close(f.done)
		resp, err := base.RoundTrip(r.WithContext(context.WithoutCancel(r.Context())))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return nil, ErrFaultInjected
	default: // FaultLate
		select {
		case <-r.Context().Done():
		case <-closed:
		}
		go func() {
			defer t.late.Done()
			defer close(f.done)
			timer := time.NewTimer(f.Late)
			select {
			case <-timer.C:
			case <-closed:
			}
			timer.Stop()
			late := r.Clone(context.WithoutCancel(r.Context()))
			late.Body = io.NopCloser(bytes.NewReader(body))
			if resp, err := base.RoundTrip(late); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		if err := r.Context().Err(); err != nil {
			return nil, err
		}
		return nil, ErrFaultInjected // closed before the caller gave up
	}
}

// TxnHas returns a FaultMatch for the Consul transactions (PUT /v1/txn)
// with a KV operation of that verb (any verb if "") on a key containing
// key.
func TxnHas(verb, key string) FaultMatch {
	return func(method, path string, body []byte) bool {
		if method != http.MethodPut || path != "/v1/txn" {
			return false
		}
		for _, op := range TxnOps(body) {
			if (verb == "" || op.Verb == verb) && strings.Contains(op.Key, key) {
				return true
			}
		}
		return false
	}
}

// TxnOp is a KV operation of a Consul transaction, as TxnOps decodes it.
type TxnOp struct{ Verb, Key string }

// TxnOps decodes the KV operations of a /v1/txn request body (nil if it is
// not one).
func TxnOps(body []byte) []TxnOp {
	var ops []struct{ KV *TxnOp }
	if json.Unmarshal(body, &ops) != nil {
		return nil
	}
	out := make([]TxnOp, 0, len(ops))
	for _, op := range ops {
		if op.KV != nil {
			out = append(out, *op.KV)
		}
	}
	return out
}
