package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"

	hfconsul "github.com/holdfast/holdfast/consul"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

// ScenarioSemaphore is the counting-semaphore scenario: contenders take
// permits of one semaphore whose limit is Options.Limit (default 4), with
// 8 and 32 contenders, each holding 0 and 1 ms (or Options.Contenders and
// Options.Hold). Rows report the contended fields (acquisitions, waits,
// fairness, requests per acquisition) plus limit, and violations count the
// acquisitions that made more than limit holders inside at once.
//
// Implementations: on Consul, holdfast's consul.Semaphore and the api
// package's api.Semaphore (native), in the same run; on etcd, holdfast's
// etcd.Semaphore alone (etcd's client has no semaphore recipe). Both stores
// add the floor with limit tokens circulating in its relay.
const ScenarioSemaphore = "semaphore"

// defaultLimit is the semaphore scenario's default limit.
const defaultLimit = 4

// semaphoreTarget is a Target that has semaphores to compare.
type semaphoreTarget interface {
	// SemaphoreImpls returns the implementations of a semaphore with limit,
	// holdfast first.
	SemaphoreImpls(limit int) []Impl
}

// semaphore runs the rows of the semaphore scenario.
func (r *runner) semaphore(ctx context.Context) error {
	st, ok := r.t.(semaphoreTarget)
	if !ok {
		return fmt.Errorf("%w: no semaphore on %s", ErrUsage, r.t.Backend())
	}
	limit := r.opts.Limit
	if limit == 0 {
		limit = defaultLimit
	}
	counts := r.opts.Contenders
	if counts == nil {
		counts = []int{8, 32}
	}
	holds := []time.Duration{0, time.Millisecond}
	if r.opts.Hold != nil {
		holds = []time.Duration{*r.opts.Hold}
	}
	impls := withFloor(r.t, st.SemaphoreImpls(limit))
	for _, hold := range holds {
		for _, n := range counts {
			rows, err := r.alternate(ctx, setting{scenario: ScenarioSemaphore, n: n, hold: hold, limit: limit}, impls)
			if err != nil {
				return err
			}
			r.emitRows(rows)
		}
	}
	return nil
}

// SemaphoreImpls implements semaphoreTarget: holdfast's etcd.Semaphore.
func (t *EtcdTarget) SemaphoreImpls(limit int) []Impl {
	return []Impl{etcdHoldfastSemaphore{t, limit}}
}

// etcdHoldfastSemaphore is holdfast's etcd.Semaphore.
type etcdHoldfastSemaphore struct {
	t     *EtcdTarget
	limit int
}

func (etcdHoldfastSemaphore) Name() string { return ImplHoldfast }

func (i etcdHoldfastSemaphore) NewContender(ctx context.Context, cfg ContenderConfig) (Contender, error) {
	cli, err := i.t.newClient(cfg.Counter)
	if err != nil {
		return nil, err
	}
	s, err := hfetcd.NewSession(ctx, cli, hfetcd.WithTTL(time.Duration(ttlSeconds(cfg.TTL))*time.Second))
	if err != nil {
		cli.Close()
		return nil, err
	}
	sem, err := hfetcd.NewSemaphore(s, cfg.Lock, i.limit)
	if err != nil {
		s.Close()
		cli.Close()
		return nil, err
	}
	return &etcdHoldfastSemContender{cli, s, sem}, nil
}

type etcdHoldfastSemContender struct {
	cli *clientv3.Client
	s   *hfetcd.Session
	sem *hfetcd.Semaphore
}

func (c *etcdHoldfastSemContender) Lock(ctx context.Context) (Held, error) {
	g, err := c.sem.Lock(ctx)
	if err != nil {
		return Held{}, err
	}
	return Held{Unlock: g.Unlock, Lost: g.Context().Done()}, nil
}

func (c *etcdHoldfastSemContender) SessionID() string { return fmt.Sprintf("%x", int64(c.s.Lease())) }

func (c *etcdHoldfastSemContender) Close() error {
	err := c.s.Close()
	c.cli.Close()
	return err
}

// SemaphoreImpls implements semaphoreTarget: holdfast's consul.Semaphore and
// api.Semaphore.
func (t *ConsulTarget) SemaphoreImpls(limit int) []Impl {
	return []Impl{consulHoldfastSemaphore{t, limit}, consulNativeSemaphore{t, limit}}
}

// consulHoldfastSemaphore is holdfast's consul.Semaphore.
type consulHoldfastSemaphore struct {
	t     *ConsulTarget
	limit int
}

func (consulHoldfastSemaphore) Name() string { return ImplHoldfast }

func (i consulHoldfastSemaphore) NewContender(ctx context.Context, cfg ContenderConfig) (Contender, error) {
	cli, tr, err := i.t.newClient(cfg.Counter)
	if err != nil {
		return nil, err
	}
	s, err := hfconsul.NewSession(ctx, cli, hfconsul.WithTTL(consulTTL(cfg.TTL)))
	if err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	sem, err := hfconsul.NewSemaphore(s, cfg.Lock, i.limit)
	if err != nil {
		s.Close()
		tr.CloseIdleConnections()
		return nil, err
	}
	return &consulHoldfastSemContender{s, sem, tr}, nil
}

type consulHoldfastSemContender struct {
	s   *hfconsul.Session
	sem *hfconsul.Semaphore
	tr  *http.Transport
}

func (c *consulHoldfastSemContender) Lock(ctx context.Context) (Held, error) {
	g, err := c.sem.Lock(ctx)
	if err != nil {
		return Held{}, err
	}
	return Held{Unlock: g.Unlock, Lost: g.Context().Done()}, nil
}

func (c *consulHoldfastSemContender) SessionID() string { return c.s.ID() }

func (c *consulHoldfastSemContender) Close() error {
	err := c.s.Close()
	c.tr.CloseIdleConnections()
	return err
}

// consulNativeSemaphore is the api package's api.Semaphore on the prefix
// <name> (what `consul lock -n <limit> <name>` uses). Each contender
// creates its session up front (Behavior delete, as api.Semaphore's own,
// renewed with RenewPeriodic), outside the measured window.
type consulNativeSemaphore struct {
	t     *ConsulTarget
	limit int
}

func (consulNativeSemaphore) Name() string { return ImplNative }

func (i consulNativeSemaphore) NewContender(ctx context.Context, cfg ContenderConfig) (c Contender, err error) {
	cli, tr, err := i.t.newClient(cfg.Counter)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			tr.CloseIdleConnections()
		}
	}()
	ttl := consulTTL(cfg.TTL).String()
	se := &api.SessionEntry{Name: api.DefaultSemaphoreSessionName, TTL: ttl, Behavior: api.SessionBehaviorDelete}
	id, _, err := cli.Session().Create(se, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("create session: %w", err)
	}
	sem, err := cli.SemaphoreOpts(&api.SemaphoreOptions{Prefix: cfg.Lock, Limit: i.limit, Session: id})
	if err != nil {
		cli.Session().Destroy(id, nil)
		return nil, err
	}
	rctx, stop := context.WithCancel(context.Background())
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		cli.Session().RenewPeriodic(ttl, id, (&api.WriteOptions{}).WithContext(rctx), nil)
	}()
	return &consulNativeSemContender{cli: cli, tr: tr, id: id, sem: sem, stop: stop, renewed: renewed}, nil
}

type consulNativeSemContender struct {
	cli     *api.Client
	tr      *http.Transport
	id      string
	sem     *api.Semaphore
	stop    context.CancelFunc
	renewed chan struct{}
}

func (c *consulNativeSemContender) Lock(ctx context.Context) (Held, error) {
	lost, err := c.sem.Acquire(ctx.Done())
	if err != nil {
		return Held{}, err
	}
	if lost == nil { // stopped through ctx
		if ctx.Err() != nil {
			return Held{}, ctx.Err()
		}
		return Held{}, errors.New("api.Semaphore returned neither a permit nor an error")
	}
	return Held{Unlock: func(context.Context) error { return c.sem.Release() }, Lost: lost}, nil
}

func (c *consulNativeSemContender) SessionID() string { return c.id }

func (c *consulNativeSemContender) Close() error {
	c.stop()
	<-c.renewed
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.cli.Session().Destroy(c.id, (&api.WriteOptions{}).WithContext(ctx))
	c.tr.CloseIdleConnections()
	return err
}
