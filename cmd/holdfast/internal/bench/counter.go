package bench

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// Counter counts the store requests of one contender's client, and the
// bytes it received. It is safe for concurrent use.
type Counter struct {
	requests atomic.Int64
	streams  atomic.Int64
	bytes    atomic.Int64
}

// Requests returns the unary gRPC calls (etcd) or HTTP requests (Consul)
// counted so far.
func (c *Counter) Requests() int64 { return c.requests.Load() }

// Streams returns the gRPC streams opened so far (etcd only).
func (c *Counter) Streams() int64 { return c.streams.Load() }

// Bytes returns the bytes received so far. etcd: every gRPC message
// received, unary responses and stream messages alike (watch events,
// keepalive responses), as stats.InPayload.WireLength (the message as sent,
// plus gRPC's 5-byte frame header), plus the received header and trailer
// frames (stats.InHeader/InTrailer.WireLength: HPACK-compressed). HTTP/2
// frame headers and control frames (SETTINGS, PING, WINDOW_UPDATE) are not
// counted. Consul: the bytes of every HTTP response body read (not the
// status line or headers).
func (c *Counter) Bytes() int64 { return c.bytes.Load() }

// DialOptions returns gRPC dial options that count every unary call (each
// attempt, as the interceptor sits inside clientv3's retry interceptor),
// every stream opened and the bytes received. Add them to
// clientv3.Config.DialOptions.
func (c *Counter) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.requests.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.streams.Add(1)
			return streamer(ctx, desc, cc, method, opts...)
		}),
		grpc.WithStatsHandler(byteCounter{c}),
	}
}

// byteCounter is a stats.Handler counting the bytes received.
type byteCounter struct{ c *Counter }

func (b byteCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (b byteCounter) HandleRPC(_ context.Context, s stats.RPCStats) {
	switch s := s.(type) {
	case *stats.InPayload:
		b.c.bytes.Add(int64(s.WireLength))
	case *stats.InHeader:
		b.c.bytes.Add(int64(s.WireLength))
	case *stats.InTrailer:
		b.c.bytes.Add(int64(s.WireLength))
	}
}

func (b byteCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (b byteCounter) HandleConn(context.Context, stats.ConnStats) {}

// RoundTripper wraps base so that every HTTP request and every response
// body byte read is counted.
func (c *Counter) RoundTripper(base http.RoundTripper) http.RoundTripper {
	return roundTripper{c, base}
}

type roundTripper struct {
	c    *Counter
	base http.RoundTripper
}

func (rt roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	rt.c.requests.Add(1)
	resp, err := rt.base.RoundTrip(req)
	if resp != nil && resp.Body != nil {
		resp.Body = &countingBody{resp.Body, rt.c}
	}
	return resp, err
}

// countingBody counts the bytes read from a response body.
type countingBody struct {
	io.ReadCloser
	c *Counter
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.c.bytes.Add(int64(n))
	return n, err
}
