package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/consul/api"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	hfconsul "github.com/holdfast/holdfast/consul"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

// ScenarioManyLocks holds many locks through one session (see RunManyLocks).
const ScenarioManyLocks = "many-locks"

// ManyLocksOptions configure RunManyLocks. The zero value of a field means
// its default.
type ManyLocksOptions struct {
	// Locks are the numbers of locks held at once, one level each (every
	// level starts from none held). Default 1,000 and 10,000. A level of
	// 0 locks, the baseline of the renewal traffic, is always measured
	// first.
	Locks []int
	// Window is how long the renewal traffic is counted at each level.
	// Default: the session TTL, that is 3 renewal periods.
	Window time.Duration
	// TTL of the session. Default 15 s (Consul: at least 10 s).
	TTL time.Duration
	// Concurrency is how many acquisitions (and releases) are in flight at
	// once. Default 32.
	Concurrency int
	// Native adds etcd's concurrency.Mutex (one per lock, on one
	// concurrency.Session) as a reference row on etcd. Ignored on Consul.
	Native bool
	// Log receives progress lines (nil: discarded).
	Log io.Writer
	// OnResult is called with each row as soon as it is done (may be nil).
	OnResult func(ManyLocksResult)
	// OnHeld, if not nil, is called while a level's locks are all held,
	// after its figures are measured (to take a heap profile, say).
	OnHeld func(ManyLocksResult)
}

// ManyLocksResult is one row of the many-locks scenario: one
// implementation holding Locks locks through one session. Fields that do
// not apply are null (the Locks = 0 row has only the renewal traffic).
type ManyLocksResult struct {
	Scenario string `json:"scenario"`
	Backend  string `json:"backend"`
	Impl     string `json:"impl"`
	Locks    int    `json:"locks"`
	// Concurrency: acquisitions (and releases) in flight at once.
	Concurrency int `json:"concurrency"`
	// AcquireAllS and ReleaseAllS: wall time to acquire all Locks locks
	// and to release them all.
	AcquireAllS *float64 `json:"acquire_all_s"`
	ReleaseAllS *float64 `json:"release_all_s"`
	// WindowS is how long the renewal traffic was counted while holding.
	WindowS float64 `json:"window_s"`
	// Renews: etcd LeaseKeepAlive stream messages sent (Consul: session
	// renew HTTP requests) during the window.
	// RenewsPerS is (renewals - 1) / (time from the first to the last
	// renewal of the window), the renewal rate free of the window's phase;
	// Renews / WindowS if fewer than 2.
	Renews     int64   `json:"renews"`
	RenewsPerS float64 `json:"renews_per_s"`
	// Requests: every store request sent during the window (etcd: unary
	// gRPC calls plus keepalive messages; Consul: every HTTP request,
	// including the check of held keys after each renewal and the
	// session's blocking query).
	// RequestsPerRenew = Requests / Renews.
	Requests         int64    `json:"requests"`
	RequestsPerS     float64  `json:"requests_per_s"`
	RequestsPerRenew *float64 `json:"requests_per_renew"`
	RPCUnit          string   `json:"rpc_unit"`
	// HeapBytesPerGrant: heap plus goroutine stacks in use after a full
	// collection, held minus before, divided by Locks, minus
	// ServerBytesPerLock.
	HeapBytesPerGrant *float64 `json:"heap_bytes_per_grant"`
	// ServerBytesPerLock (embedded etcd only, whose server runs in this
	// process): the same measure for the same requests made without
	// holdfast (the acquiring Txn on a leased key, and for holdfast a watch
	// of the key), subtracted from HeapBytesPerGrant.
	ServerBytesPerLock *float64 `json:"server_bytes_per_lock,omitempty"`
	// GoroutinesPerGrant: runtime.NumGoroutine, held minus before,
	// divided by Locks. Both measures are taken with the client's idle
	// connections closed (Consul: the concurrent acquisitions open up to
	// Concurrency connections, two goroutines and their buffers each, a
	// cost of the concurrency rather than of the held grants).
	GoroutinesPerGrant *float64 `json:"goroutines_per_grant"`
	GoroutinesDelta    *int     `json:"goroutines_delta"`
	// Lost: grants that ended while held (must be 0). Errors: failed
	// acquisitions or releases.
	Lost       int     `json:"lost"`
	Errors     int     `json:"errors"`
	TTLS       float64 `json:"ttl_s"`
	Note       string  `json:"note,omitempty"`
	FirstError string  `json:"first_error,omitempty"`
}

func (o ManyLocksOptions) withDefaults(backend string) ManyLocksOptions {
	if o.Locks == nil {
		o.Locks = []int{1000, 10000}
	}
	if o.TTL <= 0 {
		o.TTL = 15 * time.Second
	}
	if backend == "consul" {
		o.TTL = consulTTL(o.TTL)
	} else {
		o.TTL = time.Duration(ttlSeconds(o.TTL)) * time.Second
	}
	if o.Window <= 0 {
		o.Window = o.TTL
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 32
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return o
}

// Validate reports bad options. Errors wrap ErrUsage.
func (o ManyLocksOptions) Validate() error {
	for _, n := range o.Locks {
		if n < 1 || n > 100_000 {
			return fmt.Errorf("%w: locks must be between 1 and 100000, got %d", ErrUsage, n)
		}
	}
	if o.Concurrency < 0 || o.Concurrency > 128 {
		return fmt.Errorf("%w: concurrency must be between 1 and 128, got %d", ErrUsage, o.Concurrency)
	}
	if o.Window < 0 || o.TTL < 0 {
		return fmt.Errorf("%w: durations must not be negative", ErrUsage)
	}
	return nil
}

// RunManyLocks opens one session per implementation (holdfast, and with
// Native etcd's concurrency.Mutex) and, for 0 locks and then for each
// level of opts.Locks, acquires that many distinct locks through it, counts
// the renewal traffic for opts.Window, measures the heap and goroutines per
// held grant, and releases them all. Every key it wrote is deleted before
// it returns. It returns the rows measured so far with any error that
// stopped it; failed acquisitions and lost grants are counted in the rows.
func RunManyLocks(ctx context.Context, t Target, opts ManyLocksOptions) ([]ManyLocksResult, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if t == nil {
		return nil, fmt.Errorf("%w: many-locks needs a target", ErrUsage)
	}
	opts = opts.withDefaults(t.Backend())
	runID := randomID()
	var impls []manyImpl
	switch tt := t.(type) {
	case *EtcdTarget:
		impls = append(impls, &etcdMany{t: tt, native: false})
		if opts.Native {
			impls = append(impls, &etcdMany{t: tt, native: true})
		}
	case *ConsulTarget:
		impls = append(impls, &consulMany{t: tt})
	default:
		return nil, fmt.Errorf("%w: many-locks needs an etcd or Consul target, not %T", ErrUsage, t)
	}
	var out []ManyLocksResult
	for _, im := range impls {
		prefix := fmt.Sprintf("holdfast-bench/%s/many-%s", runID, im.name())
		rows, err := runManyImpl(ctx, im, prefix, opts)
		out = append(out, rows...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// manyImpl is one implementation of the many-locks scenario on one store.
type manyImpl interface {
	name() string
	backend() string
	unit() string
	// open connects a counting client and opens the session.
	open(ctx context.Context, ttl time.Duration) (manySession, error)
	// baseline makes the server-side state of n held locks without the
	// implementation (embedded etcd only) and returns a function removing
	// it; nil, nil when the server does not run in this process.
	baseline(ctx context.Context, prefix string, n int) (func(), error)
	// purge deletes every key under prefix.
	purge(ctx context.Context, prefix string) error
}

type manySession interface {
	// lock acquires the lock name and returns its release function and a
	// channel closed if the grant is lost.
	lock(ctx context.Context, name string) (unlock func(context.Context) error, lost <-chan struct{}, err error)
	// counts returns the renewals and all requests sent so far.
	counts() (renews, requests int64)
	// renewTimes returns when each renewal was sent, in order.
	renewTimes() []time.Time
	// idle closes the client's idle connections (Consul: those the
	// concurrent acquisitions opened), so that they do not count as the
	// cost of the held grants.
	idle()
	close() error
}

func runManyImpl(ctx context.Context, im manyImpl, prefix string, opts ManyLocksOptions) (rows []ManyLocksResult, err error) {
	logf := func(format string, args ...any) {
		fmt.Fprintf(opts.Log, "bench: many-locks %s %s: "+format+"\n", append([]any{im.backend(), im.name()}, args...)...)
	}
	s, err := im.open(ctx, opts.TTL)
	if err != nil {
		return nil, fmt.Errorf("many-locks %s: open session: %w", im.name(), err)
	}
	defer func() {
		if cerr := s.close(); cerr != nil && err == nil {
			err = fmt.Errorf("many-locks %s: close session: %w", im.name(), cerr)
		}
		pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if perr := im.purge(pctx, prefix+"/"); perr != nil && err == nil {
			err = fmt.Errorf("many-locks %s: delete keys under %s: %w", im.name(), prefix, perr)
		}
	}()
	emit := func(r ManyLocksResult) {
		rows = append(rows, r)
		if opts.OnResult != nil {
			opts.OnResult(r)
		}
	}
	base := func(n int) ManyLocksResult {
		return ManyLocksResult{Scenario: ScenarioManyLocks, Backend: im.backend(), Impl: im.name(), Locks: n,
			Concurrency: opts.Concurrency, RPCUnit: im.unit(), TTLS: opts.TTL.Seconds()}
	}

	logf("renewal traffic with no lock held (%v)", opts.Window)
	r0 := base(0)
	if err := countWindow(ctx, s, opts.Window, &r0); err != nil {
		return rows, err
	}
	emit(r0)

	for i, n := range opts.Locks {
		r := base(n)
		level := fmt.Sprintf("%s/%d", prefix, i)
		var server float64
		h0, _ := inUse()
		undo, err := im.baseline(ctx, level+"-server", n)
		if err != nil {
			return rows, fmt.Errorf("many-locks: server baseline: %w", err)
		}
		if undo != nil {
			h1, _ := inUse()
			server = float64(h1-h0) / float64(n)
			r.ServerBytesPerLock = num(server)
			logf("%d locks: the in-process server's own cost is %.0f B per lock", n, server)
		}

		s.idle()
		heap1, gr1 := inUse()
		logf("acquiring %d locks, %d at a time", n, opts.Concurrency)
		held, lost, acq, aerr := acquireMany(ctx, s, level, n, opts.Concurrency)
		r.AcquireAllS = num(acq.Seconds())
		r.Errors += aerr.n
		r.FirstError = aerr.first
		if ctx.Err() == nil && len(held) == n {
			if err := countWindow(ctx, s, opts.Window, &r); err != nil {
				releaseMany(context.Background(), held, opts.Concurrency)
				if undo != nil {
					undo()
				}
				return rows, err
			}
			s.idle()
			heap2, gr2 := inUse()
			r.HeapBytesPerGrant = num(float64(heap2-heap1)/float64(n) - server)
			r.GoroutinesPerGrant = num(float64(gr2-gr1) / float64(n))
			d := gr2 - gr1
			r.GoroutinesDelta = &d
			if opts.OnHeld != nil {
				opts.OnHeld(r)
			}
		} else if ctx.Err() == nil {
			r.Note = fmt.Sprintf("only %d of %d locks acquired: no traffic or memory figures", len(held), n)
		}
		for _, l := range lost {
			select {
			case <-l:
				r.Lost++
			default:
			}
		}
		logf("releasing %d locks", len(held))
		rel, rerr := releaseMany(context.WithoutCancel(ctx), held, opts.Concurrency)
		r.ReleaseAllS = num(rel.Seconds())
		r.Errors += rerr.n
		if r.FirstError == "" {
			r.FirstError = rerr.first
		}
		if undo != nil {
			undo()
		}
		emit(r)
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
	}
	return rows, nil
}

// countWindow counts the session's renewals and requests for d into r.
func countWindow(ctx context.Context, s manySession, d time.Duration, r *ManyLocksResult) error {
	ren0, req0 := s.counts()
	start := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	end := time.Now()
	el := end.Sub(start).Seconds()
	ren1, req1 := s.counts()
	r.WindowS = round(el)
	r.Renews, r.Requests = ren1-ren0, req1-req0
	r.RenewsPerS = round(float64(r.Renews) / el)
	var in []time.Time
	for _, at := range s.renewTimes() {
		if !at.Before(start) && !at.After(end) {
			in = append(in, at)
		}
	}
	if k := len(in); k >= 2 && in[k-1].After(in[0]) {
		r.RenewsPerS = round(float64(k-1) / in[k-1].Sub(in[0]).Seconds())
	}
	r.RequestsPerS = round(float64(r.Requests) / el)
	if r.Renews > 0 {
		r.RequestsPerRenew = num(float64(r.Requests) / float64(r.Renews))
	}
	return nil
}

type errCount struct {
	n     int
	first string
}

type heldLock struct {
	unlock func(context.Context) error
}

// acquireMany acquires the locks prefix/0 .. prefix/n-1, conc at a time.
func acquireMany(ctx context.Context, s manySession, prefix string, n, conc int) ([]heldLock, []<-chan struct{}, time.Duration, errCount) {
	var (
		mu    sync.Mutex
		held  = make([]heldLock, 0, n)
		lost  = make([]<-chan struct{}, 0, n)
		errs  errCount
		next  atomic.Int64
		wg    sync.WaitGroup
		start = time.Now()
	)
	for range min(conc, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				unlock, l, err := s.lock(ctx, fmt.Sprintf("%s/%d", prefix, i))
				mu.Lock()
				if err != nil {
					if ctx.Err() == nil {
						errs.n++
						if errs.first == "" {
							errs.first = err.Error()
						}
					}
				} else {
					held = append(held, heldLock{unlock})
					lost = append(lost, l)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return held, lost, time.Since(start), errs
}

// releaseMany releases held, conc at a time.
func releaseMany(ctx context.Context, held []heldLock, conc int) (time.Duration, errCount) {
	var (
		mu    sync.Mutex
		errs  errCount
		next  atomic.Int64
		wg    sync.WaitGroup
		start = time.Now()
	)
	for range min(conc, len(held)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(held) {
					return
				}
				uctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := held[i].unlock(uctx)
				cancel()
				if err != nil {
					mu.Lock()
					errs.n++
					if errs.first == "" {
						errs.first = err.Error()
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), errs
}

// inUse is the heap plus goroutine stacks in use after a full collection,
// and the number of goroutines.
func inUse() (bytes int64, goroutines int) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc + ms.StackInuse), runtime.NumGoroutine()
}

// keepAliveMethod is the gRPC method of etcd's lease keepalive stream.
const keepAliveMethod = "/etcdserverpb.Lease/LeaseKeepAlive"

// manyCounter counts an etcd client's unary calls and the messages it sends
// on LeaseKeepAlive streams.
type manyCounter struct {
	unary, keepalives atomic.Int64
	times             renewTimes
}

// renewTimes records when renewals were sent.
type renewTimes struct {
	mu sync.Mutex
	at []time.Time
}

func (t *renewTimes) add() {
	t.mu.Lock()
	t.at = append(t.at, time.Now())
	t.mu.Unlock()
}

func (t *renewTimes) renewTimes() []time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.at)
}

func (c *manyCounter) idle() {}

func (c *manyCounter) renewTimes() []time.Time { return c.times.renewTimes() }

func (c *manyCounter) counts() (renews, requests int64) {
	k := c.keepalives.Load()
	return k, k + c.unary.Load()
}

func (c *manyCounter) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.unary.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			st, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil || method != keepAliveMethod {
				return st, err
			}
			return sendCounter{st, c}, nil
		}),
	}
}

type sendCounter struct {
	grpc.ClientStream
	c *manyCounter
}

func (s sendCounter) SendMsg(m any) error {
	s.c.keepalives.Add(1)
	s.c.times.add()
	return s.ClientStream.SendMsg(m)
}

// etcdMany is holdfast's etcd.Mutex, or with native etcd's
// concurrency.Mutex, one per lock on one session.
type etcdMany struct {
	t      *EtcdTarget
	native bool
}

func (m *etcdMany) name() string {
	if m.native {
		return ImplNative
	}
	return ImplHoldfast
}
func (m *etcdMany) backend() string { return "etcd" }
func (m *etcdMany) unit() string    { return "grpc-unary+keepalive-msg" }

func (m *etcdMany) client(opts []grpc.DialOption) (*clientv3.Client, error) {
	set := func(cfg *clientv3.Config) { cfg.DialOptions = append(cfg.DialOptions, opts...) }
	if m.t.cluster != nil {
		return m.t.cluster.NewClient(set)
	}
	cfg := clientv3.Config{Endpoints: m.t.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	set(&cfg)
	return clientv3.New(cfg)
}

func (m *etcdMany) open(ctx context.Context, ttl time.Duration) (manySession, error) {
	c := &manyCounter{}
	cli, err := m.client(c.dialOptions())
	if err != nil {
		return nil, err
	}
	if m.native {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl/time.Second)), concurrency.WithContext(context.WithoutCancel(ctx)))
		if err != nil {
			cli.Close()
			return nil, err
		}
		return &etcdNativeMany{manyCounter: c, cli: cli, s: s}, nil
	}
	s, err := hfetcd.NewSession(ctx, cli, hfetcd.WithTTL(ttl))
	if err != nil {
		cli.Close()
		return nil, err
	}
	return &etcdHoldfastMany{manyCounter: c, cli: cli, s: s}, nil
}

// baseline puts n keys attached to a lease of their own with the Txn
// holdfast's acquisition sends and, for holdfast, watches each on one raw
// stream as a grant's watch does (the request TestMemoryPerGrant makes).
func (m *etcdMany) baseline(ctx context.Context, prefix string, n int) (func(), error) {
	if m.t.cluster == nil {
		return nil, nil
	}
	cli := m.t.admin
	lease, err := cli.Grant(ctx, 600)
	if err != nil {
		return nil, err
	}
	wctx, stopWatch := context.WithCancel(clientv3.WithRequireLeader(context.WithoutCancel(ctx)))
	undo := func() {
		stopWatch()
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cli.Revoke(rctx, lease.ID)
	}
	var st pb.Watch_WatchClient
	created := make(chan error, 1)
	if !m.native {
		if st, err = pb.NewWatchClient(cli.ActiveConnection()).Watch(wctx); err != nil {
			undo()
			return nil, err
		}
		go func() { // receive while sending, or flow control stops both sides
			for c := 0; c < n; {
				resp, err := st.Recv()
				if err != nil {
					created <- err
					return
				}
				if resp.Created {
					c++
				}
			}
			created <- nil
		}()
	}
	for i := range n {
		pfx := fmt.Sprintf("%s/%d/", prefix, i)
		key := fmt.Sprintf("%s%x", pfx, int64(lease.ID))
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(
			clientv3.OpGet(pfx, clientv3.WithLastCreate()...), clientv3.OpGet(pfx, clientv3.WithFirstCreate()...),
			clientv3.OpPut(key, "", clientv3.WithLease(lease.ID))).Commit()
		if err != nil {
			undo()
			return nil, err
		}
		if st != nil {
			err = st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
				Key: []byte(key), StartRevision: resp.Header.Revision + 1, WatchId: int64(i + 1),
				Filters: []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT}}}})
			if err != nil {
				undo()
				return nil, err
			}
		}
	}
	if st != nil {
		if err := <-created; err != nil {
			undo()
			return nil, err
		}
	}
	return undo, nil
}

func (m *etcdMany) purge(ctx context.Context, prefix string) error {
	_, err := m.t.admin.Delete(ctx, prefix, clientv3.WithPrefix())
	return err
}

type etcdHoldfastMany struct {
	*manyCounter
	cli *clientv3.Client
	s   *hfetcd.Session
}

func (e *etcdHoldfastMany) lock(ctx context.Context, name string) (func(context.Context) error, <-chan struct{}, error) {
	mu, err := hfetcd.NewMutex(e.s, name)
	if err != nil {
		return nil, nil, err
	}
	g, err := mu.Lock(ctx)
	if err != nil {
		return nil, nil, err
	}
	return g.Unlock, g.Context().Done(), nil
}

func (e *etcdHoldfastMany) close() error {
	err := e.s.Close()
	e.cli.Close()
	return err
}

type etcdNativeMany struct {
	*manyCounter
	cli *clientv3.Client
	s   *concurrency.Session
}

func (e *etcdNativeMany) lock(ctx context.Context, name string) (func(context.Context) error, <-chan struct{}, error) {
	mu := concurrency.NewMutex(e.s, name)
	if err := mu.Lock(ctx); err != nil {
		return nil, nil, err
	}
	return mu.Unlock, e.s.Done(), nil
}

func (e *etcdNativeMany) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := e.cli.Revoke(ctx, e.s.Lease())
	e.s.Orphan()
	e.cli.Close()
	return err
}

// consulMany is holdfast's consul.Mutex, one per lock on one session.
type consulMany struct{ t *ConsulTarget }

func (*consulMany) name() string    { return ImplHoldfast }
func (*consulMany) backend() string { return "consul" }
func (*consulMany) unit() string    { return "http-request" }

func (m *consulMany) open(ctx context.Context, ttl time.Duration) (manySession, error) {
	c := &renewCounter{}
	// newClient's transport (its connection limits), wrapped by c.
	_, tr, err := m.t.newClient(nil)
	if err != nil {
		return nil, err
	}
	c.base = tr
	cli, err := m.t.clientWith(c)
	if err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	s, err := hfconsul.NewSession(ctx, cli, hfconsul.WithTTL(ttl))
	if err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	return &consulHoldfastMany{c: c, s: s, closeConns: tr.CloseIdleConnections}, nil
}

// clientWith returns an API client of the target whose requests go through
// rt.
func (t *ConsulTarget) clientWith(rt *renewCounter) (*api.Client, error) {
	set := func(cfg *api.Config) { cfg.HttpClient = &http.Client{Transport: rt} }
	if t.agent != nil {
		return t.agent.NewClient(set)
	}
	cfg := api.DefaultConfig()
	cfg.Address = t.addr
	set(cfg)
	return api.NewClient(cfg)
}

func (*consulMany) baseline(context.Context, string, int) (func(), error) { return nil, nil }

func (m *consulMany) purge(ctx context.Context, prefix string) error {
	_, err := m.t.admin.KV().DeleteTree(prefix, (&api.WriteOptions{}).WithContext(ctx))
	return err
}

// renewCounter counts HTTP requests, and session renewals apart.
type renewCounter struct {
	base            http.RoundTripper
	requests, renew atomic.Int64
	times           renewTimes
}

func (c *renewCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	if strings.HasPrefix(req.URL.Path, "/v1/session/renew/") {
		c.renew.Add(1)
		c.times.add()
	}
	return c.base.RoundTrip(req)
}

type consulHoldfastMany struct {
	c          *renewCounter
	s          *hfconsul.Session
	closeConns func()
}

func (e *consulHoldfastMany) idle() { e.closeConns() }

func (e *consulHoldfastMany) renewTimes() []time.Time { return e.c.times.renewTimes() }

func (e *consulHoldfastMany) counts() (renews, requests int64) {
	return e.c.renew.Load(), e.c.requests.Load()
}

func (e *consulHoldfastMany) lock(ctx context.Context, name string) (func(context.Context) error, <-chan struct{}, error) {
	mu, err := hfconsul.NewMutex(e.s, name)
	if err != nil {
		return nil, nil, err
	}
	g, err := mu.Lock(ctx)
	if err != nil {
		return nil, nil, err
	}
	return g.Unlock, g.Context().Done(), nil
}

func (e *consulHoldfastMany) close() error {
	err := e.s.Close()
	e.closeConns()
	return err
}

// WriteManyLocksTable writes many-locks rows as an aligned table.
func WriteManyLocksTable(w io.Writer, rows []ManyLocksResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\timpl\tlocks\tacquire_all_s\trelease_all_s\twindow_s\trenews/s\trequests/s\treq/renew\theap_B/grant\tserver_B/lock\tgoroutines/grant\tlost\terr\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t\n", r.Backend, r.Impl, r.Locks,
			fp(r.AcquireAllS), fp(r.ReleaseAllS), f(r.WindowS), f(r.RenewsPerS), f(r.RequestsPerS), fp(r.RequestsPerRenew),
			fp(r.HeapBytesPerGrant), fp(r.ServerBytesPerLock), fp(r.GoroutinesPerGrant), r.Lost, r.Errors)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if r.FirstError != "" {
			fmt.Fprintf(w, "first error (%s %s locks=%d): %s\n", r.Backend, r.Impl, r.Locks, r.FirstError)
		}
		if r.Note != "" {
			fmt.Fprintf(w, "note (%s %s locks=%d): %s\n", r.Backend, r.Impl, r.Locks, r.Note)
		}
	}
	_, err := fmt.Fprintln(w, "renews: etcd LeaseKeepAlive messages, Consul session renew requests; requests: every store request in the window")
	return err
}

func init() {
	registerScenario(scenarioSpec{
		name:  ScenarioManyLocks,
		inAll: true,
		run:   (*runner).manyLocks,
		quick: func(o Options) Options {
			o = quickWindows(o)
			if o.Locks == nil {
				o.Locks = []int{100}
			}
			return o
		},
		table: func(w io.Writer, rows []any) error {
			var ml []ManyLocksResult
			for _, row := range rows {
				if r, ok := row.(ManyLocksResult); ok {
					ml = append(ml, r)
				}
			}
			if len(ml) == 0 {
				return nil
			}
			return WriteManyLocksTable(w, ml)
		},
	})
}

// manyLocks runs the many-locks scenario as part of Run: the renewal
// traffic is counted over the session TTL or the run's Duration, whichever
// is longer (in a quick run, over Duration alone: a smoke run, not a
// measure of renewals). Lost grants count as violations.
func (r *runner) manyLocks(ctx context.Context) error {
	window := max(r.opts.TTL, r.opts.Duration)
	if r.opts.Quick {
		window = r.opts.Duration
	}
	mo := ManyLocksOptions{Locks: r.opts.Locks, TTL: r.opts.TTL, Window: window, Native: true, Log: r.opts.Log}
	mo.OnResult = func(row ManyLocksResult) { r.emitOther(row, row.Lost, row.Errors) }
	_, err := RunManyLocks(ctx, r.t, mo)
	return err
}
