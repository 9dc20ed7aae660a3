package bench

import (
	"context"
	"net/http"
	"sync/atomic"

	"google.golang.org/grpc"
)

// Counter counts the store requests of one contender's client. It is safe
// for concurrent use.
type Counter struct {
	requests atomic.Int64
	streams  atomic.Int64
}

// Requests returns the unary gRPC calls (etcd) or HTTP requests (Consul)
// counted so far.
func (c *Counter) Requests() int64 { return c.requests.Load() }

// Streams returns the gRPC streams opened so far (etcd only).
func (c *Counter) Streams() int64 { return c.streams.Load() }

// DialOptions returns gRPC dial options that count every unary call (each
// attempt, as the interceptor sits inside clientv3's retry interceptor) and
// every stream opened. Add them to clientv3.Config.DialOptions.
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
	}
}

// RoundTripper wraps base so that every HTTP request is counted.
func (c *Counter) RoundTripper(base http.RoundTripper) http.RoundTripper {
	return roundTripper{c, base}
}

type roundTripper struct {
	c    *Counter
	base http.RoundTripper
}

func (rt roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	rt.c.requests.Add(1)
	return rt.base.RoundTrip(req)
}
