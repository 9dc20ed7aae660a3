package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

// EtcdTarget is an etcd server to benchmark on: an embedded one-member
// cluster started by StartEtcd, or external endpoints given to DialEtcd.
type EtcdTarget struct {
	cluster   *etcdtest.Cluster // nil for external endpoints
	endpoints []string
	admin     *clientv3.Client
}

// StartEtcd starts an embedded one-member etcd in a temporary directory
// (removed by Close) and returns it as a target.
func StartEtcd() (*EtcdTarget, error) { return StartEtcdNodes(1) }

// StartEtcdNodes starts an embedded etcd cluster of n members (1 to 7), in
// this process, in a temporary directory (removed by Close), and returns it
// as a target. Every contender's client has all members' endpoints (the
// client balances its requests over them).
func StartEtcdNodes(n int) (*EtcdTarget, error) {
	if n < 1 || n > 7 {
		return nil, fmt.Errorf("%w: nodes must be between 1 and 7, got %d", ErrUsage, n)
	}
	c, err := etcdtest.StartEtcd("", n)
	if err != nil {
		return nil, err
	}
	t := &EtcdTarget{cluster: c, endpoints: c.Endpoints()}
	if t.admin, err = t.newClient(nil); err != nil {
		c.Close()
		return nil, err
	}
	return t, nil
}

// DialEtcd returns a target on existing etcd endpoints.
func DialEtcd(endpoints []string) (*EtcdTarget, error) {
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%w: no etcd endpoints", ErrUsage)
	}
	t := &EtcdTarget{endpoints: endpoints}
	var err error
	if t.admin, err = t.newClient(nil); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := t.admin.Status(ctx, endpoints[0]); err != nil {
		t.admin.Close()
		return nil, fmt.Errorf("etcd at %v: %w", endpoints, err)
	}
	return t, nil
}

// Nodes returns the number of members: the embedded cluster's size, or the
// number of endpoints given to DialEtcd.
func (t *EtcdTarget) Nodes() int {
	if t.cluster != nil {
		return t.cluster.Size()
	}
	return len(t.endpoints)
}

// Endpoints returns the client endpoints.
func (t *EtcdTarget) Endpoints() []string { return t.endpoints }

// newClient returns a new client with its own connection, counting its
// requests in c (if not nil).
func (t *EtcdTarget) newClient(c *Counter) (*clientv3.Client, error) {
	set := func(cfg *clientv3.Config) {
		if c != nil {
			cfg.DialOptions = append(cfg.DialOptions, c.DialOptions()...)
		}
	}
	if t.cluster != nil {
		return t.cluster.NewClient(set)
	}
	cfg := clientv3.Config{Endpoints: t.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	set(&cfg)
	return clientv3.New(cfg)
}

// Backend implements Target.
func (t *EtcdTarget) Backend() string { return "etcd" }

// RPCUnit implements Target.
func (t *EtcdTarget) RPCUnit() string { return "grpc-unary" }

// Impls implements Target: holdfast's etcd.Mutex and etcd's
// concurrency.Mutex.
func (t *EtcdTarget) Impls() []Impl { return []Impl{etcdHoldfast{t}, etcdNative{t}} }

// Kill implements Target: it revokes the lease (sessionID in hex).
func (t *EtcdTarget) Kill(ctx context.Context, sessionID string) error {
	id, err := strconv.ParseInt(sessionID, 16, 64)
	if err != nil {
		return fmt.Errorf("bad lease ID %q: %w", sessionID, err)
	}
	_, err = t.admin.Revoke(ctx, clientv3.LeaseID(id))
	return err
}

// Close implements Target.
func (t *EtcdTarget) Close() error {
	err := t.admin.Close()
	if t.cluster != nil {
		t.cluster.Close()
	}
	return err
}

func ttlSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 2)
}

// etcdHoldfast is holdfast's etcd.Mutex.
type etcdHoldfast struct{ t *EtcdTarget }

func (etcdHoldfast) Name() string { return ImplHoldfast }

func (i etcdHoldfast) NewContender(ctx context.Context, cfg ContenderConfig) (Contender, error) {
	cli, err := i.t.newClient(cfg.Counter)
	if err != nil {
		return nil, err
	}
	s, err := hfetcd.NewSession(ctx, cli, hfetcd.WithTTL(time.Duration(ttlSeconds(cfg.TTL))*time.Second))
	if err != nil {
		cli.Close()
		return nil, err
	}
	m, err := hfetcd.NewMutex(s, cfg.Lock)
	if err != nil {
		s.Close()
		cli.Close()
		return nil, err
	}
	return &etcdHoldfastContender{cli, s, m}, nil
}

type etcdHoldfastContender struct {
	cli *clientv3.Client
	s   *hfetcd.Session
	m   *hfetcd.Mutex
}

func (c *etcdHoldfastContender) Lock(ctx context.Context) (Held, error) {
	g, err := c.m.Lock(ctx)
	if err != nil {
		return Held{}, err
	}
	return Held{Unlock: g.Unlock, Lost: g.Context().Done()}, nil
}

func (c *etcdHoldfastContender) SessionID() string { return fmt.Sprintf("%x", int64(c.s.Lease())) }

func (c *etcdHoldfastContender) Close() error {
	err := c.s.Close()
	c.cli.Close()
	return err
}

// etcdNative is etcd's own concurrency.Mutex, on a concurrency.Session.
type etcdNative struct{ t *EtcdTarget }

func (etcdNative) Name() string { return ImplNative }

func (i etcdNative) NewContender(ctx context.Context, cfg ContenderConfig) (Contender, error) {
	cli, err := i.t.newClient(cfg.Counter)
	if err != nil {
		return nil, err
	}
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttlSeconds(cfg.TTL)), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		cli.Close()
		return nil, err
	}
	// concurrency.NewMutex appends "/" itself: keys are <name>/<lease hex>,
	// the same as holdfast's.
	return &etcdNativeContender{cli, s, concurrency.NewMutex(s, cfg.Lock)}, nil
}

type etcdNativeContender struct {
	cli *clientv3.Client
	s   *concurrency.Session
	m   *concurrency.Mutex
}

func (c *etcdNativeContender) Lock(ctx context.Context) (Held, error) {
	if err := c.m.Lock(ctx); err != nil {
		return Held{}, err
	}
	return Held{Unlock: c.m.Unlock, Lost: c.s.Done()}, nil
}

func (c *etcdNativeContender) SessionID() string { return fmt.Sprintf("%x", int64(c.s.Lease())) }

func (c *etcdNativeContender) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.cli.Revoke(ctx, c.s.Lease())
	c.s.Orphan()
	c.cli.Close()
	return err
}
