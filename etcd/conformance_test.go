package etcd_test

import (
	"context"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/conformance"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/internal/leakcheck"
)

const conformanceTTL = 3 * time.Second

// conformanceSession returns a session with a client of its own, as a
// separate process would have, talking to every member through a fault
// proxy, and the faults around it.
func conformanceSession(t *testing.T, c *embedtest.Cluster) (*etcd.Session, conformance.Faults) {
	var proxies []*embedtest.Proxy
	var eps []string
	for i := range c.Size() {
		p := embedtest.StartProxy(t, hostPort(t, c.Endpoint(i)))
		proxies = append(proxies, p)
		eps = append(eps, p.URL())
	}
	var requests atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		requests.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli := c.Client(t, func(cfg *clientv3.Config) {
		cfg.Endpoints = eps
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(count))
	})
	s, err := etcd.NewSession(context.Background(), cli, etcd.WithTTL(conformanceTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	all := func(f func(*embedtest.Proxy)) func() {
		return func() {
			for _, p := range proxies {
				f(p)
			}
		}
	}
	t.Cleanup(all((*embedtest.Proxy).Mend)) // before the session closes
	admin := c.Client(t)
	return s, conformance.Faults{
		Kill: func() {
			if _, err := admin.Revoke(context.Background(), s.Lease()); err != nil {
				t.Errorf("revoke lease: %v", err)
			}
		},
		Cut:      all((*embedtest.Proxy).Blackhole),
		Freeze:   all((*embedtest.Proxy).Pause),
		Mend:     all((*embedtest.Proxy).Mend),
		Close:    func() { _ = s.Close() },
		Requests: requests.Load,
	}
}

// rwLocker adapts *etcd.RWMutex to conformance.RWLocker.
type rwLocker struct{ rw *etcd.RWMutex }

func (l rwLocker) Lock(ctx context.Context) (holdfast.Grant, error) { return asGrant(l.rw.Lock(ctx)) }
func (l rwLocker) TryLock(ctx context.Context) (holdfast.Grant, error) {
	return asGrant(l.rw.TryLock(ctx))
}
func (l rwLocker) RLock(ctx context.Context) (holdfast.Grant, error) { return asGrant(l.rw.RLock(ctx)) }
func (l rwLocker) TryRLock(ctx context.Context) (holdfast.Grant, error) {
	return asGrant(l.rw.TryRLock(ctx))
}

// asGrant keeps a nil *etcd.Grant from becoming a non-nil holdfast.Grant.
func asGrant(g *etcd.Grant, err error) (holdfast.Grant, error) {
	if err != nil {
		return nil, err
	}
	return g, nil
}

func backend(c *embedtest.Cluster) conformance.Backend {
	return conformance.Backend{
		NewLocker: func(t *testing.T, name string, opts ...holdfast.LockOption) (holdfast.Locker, conformance.Faults) {
			s, faults := conformanceSession(t, c)
			return holdfast.AsLocker[*etcd.Grant](newMutex(t, s, name, opts...)), faults
		},
		NewSemaphore: func(t *testing.T, name string, limit int) (holdfast.Locker, conformance.Faults) {
			s, faults := conformanceSession(t, c)
			return holdfast.AsLocker[*etcd.Grant](newSemaphore(t, s, name, limit)), faults
		},
		NewRWMutex: func(t *testing.T, name string) (conformance.RWLocker, conformance.Faults) {
			s, faults := conformanceSession(t, c)
			return rwLocker{newRWMutex(t, s, name)}, faults
		},
		Keys: func(t *testing.T, name string) []string {
			cli := c.Client(t)
			resp, err := cli.Get(context.Background(), name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				t.Fatalf("list keys: %v", err)
			}
			ks := make([]string, 0, len(resp.Kvs))
			for _, kv := range resp.Kvs {
				ks = append(ks, string(kv.Key))
			}
			sort.Strings(ks)
			return ks
		},
		Delete: func(t *testing.T, key string) {
			if _, err := c.Client(t).Delete(context.Background(), key); err != nil {
				t.Fatalf("delete %s: %v", key, err)
			}
		},
		TTL:    conformanceTTL,
		Margin: conformanceTTL / 5,
		// Revocation or deletion is seen through the session's watch of the
		// grant's key (created 100 ms after the grant, served by etcd within
		// 100 ms if it starts in the past), plus slack.
		LossNotice: 500 * time.Millisecond,
	}
}

func TestConformanceOneNode(t *testing.T) {
	leakcheck.Check(t)
	conformance.Run(t, backend(embedtest.Etcd(t)))
}

func TestConformanceThreeNodes(t *testing.T) {
	conformance.Run(t, backend(embedtest.EtcdCluster(t, 3)))
}
