package etcdtest

import (
	"context"
	"reflect"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FaultMode is what Faults does to a request a rule matches.
type FaultMode int

// The fault modes.
const (
	// Refuse: the request is not sent; the caller gets codes.Unavailable
	// (as from a member that refused it before applying it).
	Refuse FaultMode = iota + 1
	// LoseAnswer: the request is sent and applied; the caller gets
	// codes.Unavailable instead of the answer (a connection that broke
	// before the answer came back).
	LoseAnswer
	// Late (unary requests only): the request is held until the caller's
	// context ends (or Rule.Hold passes), the caller gets its context's
	// error (codes.Unavailable after Hold), and the request is sent
	// Rule.Delay later in the background, with a fresh context (a request
	// that reached the server after its client gave up).
	Late
)

func (m FaultMode) String() string {
	switch m {
	case Refuse:
		return "refused"
	case LoseAnswer:
		return "answer-lost"
	case Late:
		return "late"
	}
	return "none"
}

// Rule says which request Faults hits and how.
type Rule struct {
	// Method is the full gRPC method, such as "/etcdserverpb.KV/Txn" or
	// "/etcdserverpb.Lease/LeaseKeepAlive" (a stream); "" matches any.
	Method string
	// Match, if set, must also accept the request (a *etcdserverpb.TxnRequest,
	// say; nil for a stream, matched at its creation).
	Match func(method string, req any) bool
	// Nth: the rule hits the Nth request it matches (1, the first, if 0),
	// once.
	Nth  int
	Mode FaultMode
	// Hold bounds how long Late holds a request whose caller's context does
	// not end (default 2 s); Delay is how long after the caller's return
	// the held request is sent (default 100 ms).
	Hold, Delay time.Duration
}

// Faults is a gRPC client interceptor for clientv3 that injects one fault
// per Rule into the requests the rule matches: refused before it is
// applied, applied with its answer lost, or delivered after the caller's
// context ended (see FaultMode). Give it to a client with
// clientv3.Config.DialOptions = f.DialOptions(). It sits below clientv3's
// own retries, so it sees every attempt; clientv3 does not retry a
// mutation that failed with codes.Unavailable after it was sent, so the
// caller sees the fault. Streams (Watch, LeaseKeepAlive) take Refuse (the
// stream is not opened) and LoseAnswer (the first answer is dropped and
// the stream ends), matched at their creation.
//
// A Faults is safe for concurrent use and may serve several clients.
type Faults struct {
	mu      sync.Mutex
	rules   []*armed
	observe func(method string, req any)
	late    sync.WaitGroup
}

type armed struct {
	Rule
	seen int
	hit  bool
}

// NewFaults returns a Faults with no rule: it passes everything through.
func NewFaults() *Faults { return &Faults{} }

// Inject arms r; the returned function reports whether it has hit.
func (f *Faults) Inject(r Rule) (hit func() bool) {
	if r.Nth <= 0 {
		r.Nth = 1
	}
	if r.Hold <= 0 {
		r.Hold = 2 * time.Second
	}
	if r.Delay <= 0 {
		r.Delay = 100 * time.Millisecond
	}
	a := &armed{Rule: r}
	f.mu.Lock()
	f.rules = append(f.rules, a)
	f.mu.Unlock()
	return func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return a.hit
	}
}

// Observe calls fn with every request (unary) or stream creation (req
// nil) before any rule acts on it. fn must not block.
func (f *Faults) Observe(fn func(method string, req any)) {
	f.mu.Lock()
	f.observe = fn
	f.mu.Unlock()
}

// Wait waits until every Late request held so far has been delivered (or
// has failed).
func (f *Faults) Wait() { f.late.Wait() }

// DialOptions returns the options that install f on a client.
func (f *Faults) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(f.Unary), grpc.WithChainStreamInterceptor(f.Stream)}
}

// Install adds f's DialOptions to cfg: Cluster.NewClient(f.Install)
// returns a client whose requests f sees.
func (f *Faults) Install(cfg *clientv3.Config) {
	cfg.DialOptions = append(cfg.DialOptions, f.DialOptions()...)
}

// fire returns the rule that hits this request, if any (Mode 0: none).
func (f *Faults) fire(method string, req any) Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.observe != nil {
		f.observe(method, req)
	}
	for _, a := range f.rules {
		if a.hit || a.Method != "" && a.Method != method || a.Match != nil && !a.Match(method, req) {
			continue
		}
		if a.seen++; a.seen == a.Nth {
			a.hit = true
			return a.Rule
		}
	}
	return Rule{}
}

// Unary is the unary interceptor.
func (f *Faults) Unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	r := f.fire(method, req)
	switch r.Mode {
	case Refuse:
		return status.Error(codes.Unavailable, "etcdtest: request refused (injected)")
	case LoseAnswer:
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "etcdtest: answer lost (injected)")
	case Late:
		t := time.NewTimer(r.Hold)
		defer t.Stop()
		err := status.Error(codes.Unavailable, "etcdtest: request held (injected)")
		select {
		case <-ctx.Done():
			err = status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
		fresh := reflect.New(reflect.TypeOf(reply).Elem()).Interface()
		f.late.Add(1)
		go func() {
			defer f.late.Done()
			time.Sleep(r.Delay)
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = invoker(dctx, method, req, fresh, cc, opts...)
		}()
		return err
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// Stream is the stream interceptor.
func (f *Faults) Stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	switch f.fire(method, nil).Mode {
	case Refuse:
		return nil, status.Error(codes.Unavailable, "etcdtest: stream refused (injected)")
	case LoseAnswer:
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &lossy{ClientStream: s}, nil
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// lossy drops the first message it receives and ends the stream.
type lossy struct{ grpc.ClientStream }

func (l *lossy) RecvMsg(m any) error {
	if err := l.ClientStream.RecvMsg(m); err != nil {
		return err
	}
	return status.Error(codes.Unavailable, "etcdtest: answer lost (injected)")
}
