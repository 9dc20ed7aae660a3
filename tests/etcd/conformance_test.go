package etcd_test

import (
	"context"
	"flag"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/conformance"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/embedtest/leakcheck"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/leader"
)

const conformanceTTL = 3 * time.Second

// conformanceSession returns a session of its own, with a client of its
// own that reaches every member through its own fault proxy, as a separate
// process would, and the faults that act on them.
func conformanceSession(t *testing.T, c *etcdtest.Cluster) (*etcd.Session, conformance.Faults) {
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

func backend(c *etcdtest.Cluster) conformance.Backend {
	return conformance.Backend{
		NewLocker: func(t *testing.T, name string, opts ...holdfast.LockOption) (holdfast.Locker, conformance.Faults) {
			s, f := conformanceSession(t, c)
			return holdfast.AsLocker[*etcd.Grant](newMutex(t, s, name, opts...)), f
		},
		NewSemaphore: func(t *testing.T, name string, limit int, opts ...holdfast.LockOption) (holdfast.Locker, conformance.Faults) {
			s, f := conformanceSession(t, c)
			sem, err := etcd.NewSemaphore(s, name, limit, opts...)
			if err != nil {
				t.Fatalf("NewSemaphore(%q, %d): %v", name, limit, err)
			}
			return holdfast.AsLocker[*etcd.Grant](sem), f
		},
		NewRWMutex: func(t *testing.T, name string) (conformance.RWLocker, conformance.Faults) {
			s, f := conformanceSession(t, c)
			rw, err := etcd.NewRWMutex(s, name)
			if err != nil {
				t.Fatalf("NewRWMutex(%q): %v", name, err)
			}
			return conformance.AsRWLocker[*etcd.Grant](rw), f
		},
		TryNewRWMutex: func(t *testing.T, name string, opts ...holdfast.LockOption) (conformance.RWLocker, error) {
			s, _ := conformanceSession(t, c)
			rw, err := etcd.NewRWMutex(s, name, opts...)
			if err != nil {
				return nil, err
			}
			return conformance.AsRWLocker[*etcd.Grant](rw), nil
		},
		NewElection: func(t *testing.T, name string) (leader.Candidate[holdfast.Grant], conformance.Faults) {
			s, f := conformanceSession(t, c)
			e, err := etcd.NewElection(s, name)
			if err != nil {
				t.Fatalf("NewElection(%q): %v", name, err)
			}
			return conformance.AsCandidate[*etcd.Grant](e), f
		},
		NewClaimer: func(t *testing.T, name string, sched holdfast.Schedule) (conformance.Claimer, conformance.Faults) {
			s, f := conformanceSession(t, c)
			o, err := etcd.NewOnce(s, name, sched)
			if err != nil {
				t.Fatalf("NewOnce(%q): %v", name, err)
			}
			return conformance.AsClaimer[*etcd.Claim](o), f
		},
		NewMultiLocker: func(t *testing.T) (func(names ...string) (conformance.MultiLocker, error), conformance.Faults) {
			s, f := conformanceSession(t, c)
			return func(names ...string) (conformance.MultiLocker, error) {
				m, err := etcd.NewMultiMutex(s, names...)
				if err != nil {
					return nil, err
				}
				return conformance.AsMultiLocker[*etcd.MultiGrant](m), nil
			}, f
		},
		// A crashed claim's lease (at least 2 s, etcd's shortest) is
		// checked for expiry every 500 ms; a released claim's is revoked.
		ClaimFree: 2500 * time.Millisecond,
		// Observe delivers every leader, in order, however slow the reader.
		ObserveAll: true,
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
	conformance.Run(t, backend(etcdtest.Etcd(t)))
}

var conformanceFull = flag.Bool("conformance.full", false, "TestConformanceThreeNodes: every property of the suite (make conformance-full)")

// TestConformanceThreeNodes runs the suite on a 3-member cluster, but for
// the claim properties (ClaimOnce, ClaimLate, ClaimAtMost, ClaimTicks: 31 s
// of its 81 s) unless -conformance.full: etcd.Once is one transaction and
// a lease, the same on one member as on three, and TestConformanceOneNode
// runs them.
func TestConformanceThreeNodes(t *testing.T) {
	t.Parallel() // its own etcd, and mostly waiting: beside the other long tests
	b := backend(etcdtest.EtcdCluster(t, 3))
	if !*conformanceFull {
		b.NewClaimer = nil
	}
	conformance.Run(t, b)
}
