package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/consul/api"

	hfconsul "github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
)

// ConsulTarget is a Consul agent to benchmark on: a `consul agent -dev`
// started by StartConsul, or an existing agent given to DialConsul.
type ConsulTarget struct {
	agent   *embedtest.ConsulAgent // nil for an external agent
	addr    string
	admin   *api.Client
	adminTr *http.Transport
	nodes   int
}

// StartConsul starts a real Consul dev agent (see embedtest.StartConsul) and
// returns it as a target.
func StartConsul() (*ConsulTarget, error) {
	a, err := embedtest.StartConsul()
	if err != nil {
		return nil, err
	}
	t := &ConsulTarget{agent: a, addr: a.HTTPAddr, nodes: 1}
	if t.admin, t.adminTr, err = t.newClient(nil); err != nil {
		a.Close()
		return nil, err
	}
	return t, nil
}

// DialConsul returns a target on the agent at addr (host:port of its HTTP
// API).
func DialConsul(addr string) (*ConsulTarget, error) {
	if addr == "" {
		return nil, fmt.Errorf("%w: no Consul address", ErrUsage)
	}
	t := &ConsulTarget{addr: addr}
	var err error
	if t.admin, t.adminTr, err = t.newClient(nil); err != nil {
		return nil, err
	}
	if _, err := t.admin.Status().Leader(); err != nil {
		return nil, fmt.Errorf("consul at %s: %w", addr, err)
	}
	if peers, err := t.admin.Status().Peers(); err == nil {
		t.nodes = len(peers)
	}
	return t, nil
}

// Nodes returns the number of Consul servers (1 for the dev agent; the raft
// peers reported by an external agent when it was dialled).
func (t *ConsulTarget) Nodes() int { return t.nodes }

// Addr returns the agent's HTTP address.
func (t *ConsulTarget) Addr() string { return t.addr }

// newClient returns a new API client with its own HTTP transport (its own
// connections), counting its requests in c (if not nil). The caller closes
// the transport's idle connections when done with the client.
func (t *ConsulTarget) newClient(c *Counter) (*api.Client, *http.Transport, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	// Contenders all come from 127.0.0.1, and Consul limits the connections
	// per client IP (limits.http_max_conns_per_client, default 200): do not
	// let a finished row's connections linger.
	tr.IdleConnTimeout = 5 * time.Second
	var rt http.RoundTripper = tr
	if c != nil {
		rt = c.RoundTripper(tr)
	}
	set := func(cfg *api.Config) {
		cfg.HttpClient = &http.Client{Transport: rt}
	}
	var cli *api.Client
	var err error
	if t.agent != nil {
		cli, err = t.agent.NewClient(set)
	} else {
		cfg := api.DefaultConfig()
		cfg.Address = t.addr
		set(cfg)
		cli, err = api.NewClient(cfg)
	}
	if err != nil {
		return nil, nil, err
	}
	return cli, tr, nil
}

// Backend implements Target.
func (t *ConsulTarget) Backend() string { return "consul" }

// RPCUnit implements Target.
func (t *ConsulTarget) RPCUnit() string { return "http-request" }

// Impls implements Target: holdfast's consul.Mutex and api.Lock.
func (t *ConsulTarget) Impls() []Impl { return []Impl{consulHoldfast{t}, consulNative{t}} }

// Kill implements Target: it destroys the session.
func (t *ConsulTarget) Kill(ctx context.Context, sessionID string) error {
	_, err := t.admin.Session().Destroy(sessionID, (&api.WriteOptions{}).WithContext(ctx))
	return err
}

// Close implements Target.
func (t *ConsulTarget) Close() error {
	if t.adminTr != nil {
		t.adminTr.CloseIdleConnections()
	}
	if t.agent != nil {
		t.agent.Close()
	}
	return nil
}

func consulTTL(d time.Duration) time.Duration { return max(d, 10*time.Second) }

// consulHoldfast is holdfast's consul.Mutex.
type consulHoldfast struct{ t *ConsulTarget }

func (consulHoldfast) Name() string { return ImplHoldfast }

func (i consulHoldfast) NewContender(ctx context.Context, cfg ContenderConfig) (Contender, error) {
	cli, tr, err := i.t.newClient(cfg.Counter)
	if err != nil {
		return nil, err
	}
	opts := []hfconsul.SessionOption{hfconsul.WithTTL(consulTTL(cfg.TTL))}
	if cfg.LockDelay >= 0 {
		opts = append(opts, hfconsul.WithLockDelay(cfg.LockDelay))
	}
	s, err := hfconsul.NewSession(ctx, cli, opts...)
	if err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	m, err := hfconsul.NewMutex(s, cfg.Lock)
	if err != nil {
		s.Close()
		tr.CloseIdleConnections()
		return nil, err
	}
	return &consulHoldfastContender{s, m, tr}, nil
}

type consulHoldfastContender struct {
	s  *hfconsul.Session
	m  *hfconsul.Mutex
	tr *http.Transport
}

func (c *consulHoldfastContender) Lock(ctx context.Context) (Held, error) {
	g, err := c.m.Lock(ctx)
	if err != nil {
		return Held{}, err
	}
	return Held{Unlock: g.Unlock, Lost: g.Context().Done()}, nil
}

func (c *consulHoldfastContender) SessionID() string { return c.s.ID() }

func (c *consulHoldfastContender) Close() error {
	err := c.s.Close()
	c.tr.CloseIdleConnections()
	return err
}

// consulNative is Consul's api.Lock on the key <name>/.lock (what `consul
// lock <name>` uses). Each contender creates one session up front, as the
// benchmark keeps session creation outside the measured window, and passes it
// in LockOptions.Session; the session is renewed with RenewPeriodic like
// api.Lock's own.
type consulNative struct{ t *ConsulTarget }

func (consulNative) Name() string { return ImplNative }

func (i consulNative) NewContender(ctx context.Context, cfg ContenderConfig) (c Contender, err error) {
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
	wo := (&api.WriteOptions{}).WithContext(ctx)
	var id string
	if cfg.LockDelay == 0 {
		// The Go api omits a zero LockDelay (the server then applies its
		// 15 s default), so ask for 0 with a raw request.
		var out struct{ ID string }
		body := map[string]any{"Name": api.DefaultLockSessionName, "TTL": ttl, "LockDelay": "0s"}
		if _, err := cli.Raw().Write("/v1/session/create", body, &out, wo); err != nil {
			return nil, fmt.Errorf("create session: %w", err)
		}
		id = out.ID
	} else {
		se := &api.SessionEntry{Name: api.DefaultLockSessionName, TTL: ttl}
		if cfg.LockDelay > 0 {
			se.LockDelay = cfg.LockDelay
		}
		if id, _, err = cli.Session().Create(se, wo); err != nil {
			return nil, fmt.Errorf("create session: %w", err)
		}
	}
	lock, err := cli.LockOpts(&api.LockOptions{Key: cfg.Lock + "/.lock", Session: id})
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
	return &consulNativeContender{cli: cli, tr: tr, id: id, lock: lock, stop: stop, renewed: renewed}, nil
}

type consulNativeContender struct {
	cli     *api.Client
	tr      *http.Transport
	id      string
	lock    *api.Lock
	stop    context.CancelFunc
	renewed chan struct{}
}

func (c *consulNativeContender) Lock(ctx context.Context) (Held, error) {
	lost, err := c.lock.Lock(ctx.Done())
	if err != nil {
		return Held{}, err
	}
	if lost == nil { // stopped through ctx
		if ctx.Err() != nil {
			return Held{}, ctx.Err()
		}
		return Held{}, errors.New("api.Lock returned neither a lock nor an error")
	}
	return Held{Unlock: func(context.Context) error { return c.lock.Unlock() }, Lost: lost}, nil
}

func (c *consulNativeContender) SessionID() string { return c.id }

func (c *consulNativeContender) Close() error {
	c.stop()
	<-c.renewed
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.cli.Session().Destroy(c.id, (&api.WriteOptions{}).WithContext(ctx))
	c.tr.CloseIdleConnections()
	return err
}
