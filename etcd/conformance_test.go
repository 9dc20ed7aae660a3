package etcd_test

import (
	"context"
	"sort"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/conformance"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/internal/leakcheck"
)

const conformanceTTL = 3 * time.Second

func backend(c *embedtest.Cluster) conformance.Backend {
	return conformance.Backend{
		NewLocker: func(t *testing.T, name string, opts ...holdfast.LockOption) (holdfast.Locker, func()) {
			// Each locker has its own client and session, as a separate
			// process would.
			s := newSession(t, c, etcd.WithTTL(conformanceTTL))
			m := newMutex(t, s, name, opts...)
			admin := c.Client(t)
			kill := func() {
				if _, err := admin.Revoke(context.Background(), s.Lease()); err != nil {
					t.Errorf("revoke lease: %v", err)
				}
			}
			return holdfast.AsLocker[*etcd.Grant](m), kill
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
		// Revocation is seen through the session's watch of the grant's key
		// (created 100 ms after the grant, served by etcd within 100 ms if it
		// starts in the past), plus slack.
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
