package consul

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-cleanhttp"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

const (
	// defaultTTL is the session TTL when WithTTL is not given.
	defaultTTL = 15 * time.Second
	// MinTTL is the shortest session TTL Consul accepts (the server's default
	// session_ttl_min).
	MinTTL = 10 * time.Second
	// MaxTTL is the longest session TTL Consul accepts.
	MaxTTL = 24 * time.Hour
	// defaultLockDelay is Consul's own default lock-delay.
	defaultLockDelay = 15 * time.Second
	// MaxLockDelay is the longest lock-delay Consul applies.
	MaxLockDelay = 60 * time.Second
	// defaultSessionName is the session name when WithSessionName is not
	// given.
	defaultSessionName = "holdfast"
)

const (
	// requestTimeout bounds every non-blocking HTTP request.
	requestTimeout = 10 * time.Second
	// blockWait is the wait time of blocking queries on lock and queue keys:
	// a waiter re-reads at least this often.
	blockWait = 5 * time.Second
	// monitorWait is the wait time of the blocking query that watches the
	// session itself.
	monitorWait = 10 * time.Second
	// closeTimeout bounds the requests Close makes.
	closeTimeout = 10 * time.Second
	// maxDelayCache bounds the cache of other sessions' lock-delays.
	maxDelayCache = 1024
	// maxCheckOps is the most keys one read of the held keys covers (see
	// Session.checkKeys).
	maxCheckOps = 64
	// dialTimeout bounds the TCP connect and TLS handshake of a client
	// made by Dial.
	dialTimeout = 5 * time.Second
)

type sessionConfig struct {
	ttl        time.Duration
	margin     time.Duration
	marginSet  bool // else margin = TTL/5
	lockDelay  time.Duration
	behavior   string
	nodeChecks []string
	name       string
	dial       dialConfig // options for Dial's own client (see tls.go)
	observers  []holdfast.Observer
	logger     *slog.Logger
}

// SessionOption configures NewSession.
type SessionOption func(*sessionConfig)

// WithTTL sets the session TTL (default 15 s). Consul accepts MinTTL
// (10 s) to MaxTTL (24 h); anything else is an error wrapping
// holdfast.ErrInvalidTTL, returned before any request. A holder that crashes
// keeps its locks until Consul invalidates its session, which happens between
// TTL and 2 x TTL after the last renewal reached the server.
func WithTTL(d time.Duration) SessionOption { return func(c *sessionConfig) { c.ttl = d } }

// WithMargin sets the safety margin of the local deadline (default TTL/5;
// from 0 to TTL/2, else an error wrapping holdfast.ErrInvalidTTL). The
// context of every grant of the session is cancelled at
//
//	(send time of the last acknowledged renewal) + TTL - margin
//
// on this process's monotonic clock. Consul cannot invalidate the session
// earlier than TTL after it received that renewal (it actually waits up to
// 2 x TTL), and the renewal was received after it was sent, so the holder is
// told before any other client can acquire its locks, provided that this
// clock and the Consul leader's run at rates that differ by less than
// margin/TTL (20% by default), and that the holder acts on the cancellation
// within the rest of the margin. This assumes bounded clock-rate drift, not
// synchronized clocks: wall-clock steps on either side do not matter.
//
// It also assumes the session is invalidated only by its TTL: see
// WithNodeChecks.
func WithMargin(d time.Duration) SessionOption {
	return func(c *sessionConfig) { c.margin, c.marginSet = d, true }
}

// WithLockDelay sets the session's lock-delay (default 15 s, Consul's
// default). After Consul invalidates a session (TTL expiry,
// destroy, failed health check), the keys it held cannot be acquired by
// anyone for that long; a normal Unlock imposes no delay. 0 disables it: it
// is really sent as "0s" (the Go API client cannot express 0). More than
// MaxLockDelay (60 s), or negative, is an error wrapping
// holdfast.ErrInvalidArgument. Delays are sent in whole milliseconds.
//
// Lock-delay is a second line of defence for holders that do not use their
// grant's context or fencing tokens: it gives a paused holder that much more
// time to notice before anyone else gets in. holdfast waiters acquire at the
// end of the delay (not rounded up to 5 s retry ticks as with api.Lock).
func WithLockDelay(d time.Duration) SessionOption { return func(c *sessionConfig) { c.lockDelay = d } }

// WithBehavior sets what Consul does to the keys the session holds when it
// invalidates the session (its TTL expired, it was destroyed):
// api.SessionBehaviorDelete (the default: they are deleted, so a holder or
// waiter that was cut off or killed leaves nothing under the name) or
// api.SessionBehaviorRelease (api.Lock's: they stay, unlocked, until the
// next contender of the name reads and deletes them). Anything else is an
// error wrapping holdfast.ErrInvalidArgument. The lock-delay applies
// either way.
func WithBehavior(b string) SessionOption { return func(c *sessionConfig) { c.behavior = b } }

// WithNodeChecks ties the session to health checks of the agent's node (for
// example "serfHealth", which Consul itself uses by default for sessions
// created without options).
//
// The default here is no checks at all: Consul then invalidates the session
// only when its TTL runs out (or it is destroyed), which the safe local
// deadline (see WithMargin) anticipates. A node check favours liveness over
// safety: when the node is declared failed, the session is invalidated at
// once, so its locks free up faster, but the server may do so with no
// advance notice to the holder, which may still be running (a holder on a
// node that is merely partitioned from the servers, for instance). With node
// checks, rely on fencing tokens (Grant.Token) or guarded writes (Grant.Txn),
// not on the grant's context alone.
func WithNodeChecks(ids ...string) SessionOption {
	ids = slices.Clone(ids)
	return func(c *sessionConfig) { c.nodeChecks = ids }
}

// WithSessionName sets the session's name, as shown by Consul (default
// "holdfast").
func WithSessionName(n string) SessionOption { return func(c *sessionConfig) { c.name = n } }

// WithObserver adds an observer of the session's events (grants, their
// ends, renewal failures, the session's end): package metrics provides one
// for Prometheus. Observers are called synchronously and must not block.
func WithObserver(o holdfast.Observer) SessionOption {
	return func(c *sessionConfig) { c.observers = append(c.observers, o) }
}

// WithLogger logs the session's events to l with log/slog: grants (Info),
// releases (Debug), losses with their cause (Warn), renewal failures
// (Warn), and the session's end (Info when closed, Warn when lost), each
// with the attributes store=consul and session=<session ID>. Without it,
// holdfast logs nothing.
func WithLogger(l *slog.Logger) SessionOption {
	return func(c *sessionConfig) {
		if l != nil {
			c.logger = l
		}
	}
}

func newSessionConfig(opts []SessionOption) (sessionConfig, error) {
	c := sessionConfig{
		ttl:       defaultTTL,
		lockDelay: defaultLockDelay,
		behavior:  api.SessionBehaviorDelete,
		name:      defaultSessionName,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	switch {
	case c.ttl < MinTTL || c.ttl > MaxTTL:
		return c, fmt.Errorf("%w: %v is outside Consul's session TTL range [%v, %v]", holdfast.ErrInvalidTTL, c.ttl, MinTTL, MaxTTL)
	case c.lockDelay < 0 || c.lockDelay > MaxLockDelay:
		return c, fmt.Errorf("%w: lock-delay %v is not between 0 and %v", holdfast.ErrInvalidArgument, c.lockDelay, MaxLockDelay)
	case c.behavior != api.SessionBehaviorRelease && c.behavior != api.SessionBehaviorDelete:
		return c, fmt.Errorf("%w: session behavior %q is neither %q nor %q", holdfast.ErrInvalidArgument, c.behavior, api.SessionBehaviorRelease, api.SessionBehaviorDelete)
	}
	for _, id := range c.nodeChecks {
		if id == "" {
			return c, fmt.Errorf("%w: empty node check ID", holdfast.ErrInvalidArgument)
		}
	}
	if err := c.dial.check(); err != nil {
		return c, err
	}
	var err error
	c.margin, err = core.Margin(c.ttl, c.margin, c.marginSet)
	return c, err
}

// Session is a Consul session renewed in the background. Every lock taken
// through a Session is acquired with it, so one session and one renewal
// serve any number of locks. When the session cannot be renewed before its
// safe local deadline, Consul says it no longer exists, or the Session is
// closed, the context of every grant is cancelled with the reason. A
// Session does not come back after that: Close it (which gives its keys back
// at once if Consul can still be reached) and create a new one.
//
// How fast a loss is noticed: a session destroyed or invalidated in Consul
// is seen within milliseconds, through a blocking query on the session (one
// per Session). A lock key deleted or taken over from outside while our
// session held it (an operator's `consul kv delete`, say) is seen by the
// check of held keys that follows every renewal, so within TTL/3 (5 s at the
// default TTL), or at once when a guarded write (Grant.Txn) or an Unlock of
// the session finds one of its keys gone. That check costs one read-only
// transaction per 64 held keys per renewal, and no goroutine or connection
// per grant. A write to a held lock key that keeps our session on it (a
// "poke": a new value, as Consul's own lock tests do) does not end a grant.
//
// A Session is safe for concurrent use.
type Session struct {
	client *api.Client
	owned  *http.Transport // the transport of a client made by Dial, else nil
	id     string
	cfg    sessionConfig
	keeper *core.Keeper
	bg     *core.Background
	names  core.Names

	stop     context.CancelFunc // stops the background goroutines
	tasks    sync.WaitGroup     // the background goroutines
	checkNow chan struct{}      // asks the renewal goroutine to check the held keys now

	mu        sync.Mutex
	closed    bool
	ops       sync.WaitGroup           // acquisitions in progress
	held      map[string]*Grant        // by lock key: grants held in Consul
	delays    map[string]time.Duration // lock-delay of other sessions, by ID
	abandoned map[string]leftover      // by lock name: cleanups the session's end cut short

	closeOnce sync.Once
	closeErr  error
}

// Dial creates a Consul API client for the agent at addr ("host:port", or
// a URL such as "https://host:8501"; "" means api.DefaultConfig's address:
// $CONSUL_HTTP_ADDR, else 127.0.0.1:8500) and opens a session on it with
// NewSession. The rest of the client's configuration (token, TLS) comes from
// the environment as with api.DefaultConfig ($CONSUL_HTTP_TOKEN,
// $CONSUL_HTTP_TOKEN_FILE, $CONSUL_HTTP_SSL, $CONSUL_CACERT,
// $CONSUL_CLIENT_CERT, $CONSUL_CLIENT_KEY...), unless WithToken, WithTLS or
// WithTLSFiles say otherwise. ACL refusals (no token, an unknown token, one
// without session or key write) are errors wrapping
// holdfast.ErrPermissionDenied; no error contains the token or key
// material. The client belongs to the session: Close closes its
// connections. Connecting and the TLS handshake
// time out after 5 s; every request of the session is bounded by its own
// context (non-blocking requests by 10 s at most), and ctx bounds the
// creation of the session (at most 10 s as well). An unreachable agent is
// reported at once with the connection error.
func Dial(ctx context.Context, addr string, opts ...SessionOption) (*Session, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	cfg := api.DefaultConfig()
	if addr != "" {
		cfg.Address = addr
	}
	tr := cleanhttp.DefaultPooledTransport()
	tr.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = dialTimeout
	cfg.Transport = tr
	sc, err := newSessionConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := sc.dial.apply(cfg, tr); err != nil {
		return nil, err
	}
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: holdfast/consul: client for %q: %w", holdfast.ErrInvalidArgument, addr, err)
	}
	s, err := openSession(ctx, client, tr, sc)
	if err != nil {
		tr.CloseIdleConnections()
		return nil, explainTLS(err, cfg.Scheme, cfg.Address, tr.TLSClientConfig)
	}
	return s, nil
}

// NewSession creates a Consul session through client and renews it until
// Close, or until it is lost. ctx bounds only the creation, which is sent
// again while Consul answers that it did not apply it (no leader yet, or
// the agent's node not registered yet, as for a moment after the agent
// starts). Options are
// checked before any request; a nil client is an error wrapping
// holdfast.ErrInvalidArgument, and so are the options for Dial only
// (WithToken, WithTLS, WithTLSFiles: configure the client instead); an ACL
// refusal is one wrapping holdfast.ErrPermissionDenied. The client stays the caller's: Close does not
// close it.
func NewSession(ctx context.Context, client *api.Client, opts ...SessionOption) (*Session, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil Consul client", holdfast.ErrInvalidArgument)
	}
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	cfg, err := newSessionConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := cfg.dial.dialOnly(); err != nil {
		return nil, err
	}
	return openSession(ctx, client, nil, cfg)
}

func openSession(ctx context.Context, client *api.Client, owned *http.Transport, cfg sessionConfig) (*Session, error) {
	cfg.dial = dialConfig{} // nothing of the credentials stays in the session
	checks := cfg.nodeChecks
	if checks == nil {
		checks = []string{}
	}
	body := map[string]any{
		"Name":       cfg.name,
		"TTL":        cfg.ttl.String(),
		"LockDelay":  fmt.Sprintf("%dms", ceilMillis(cfg.lockDelay)),
		"Behavior":   cfg.behavior,
		"NodeChecks": checks,
	}
	id, sent, err := createSession(ctx, client, body)
	if err != nil {
		return nil, apiError("create session", err)
	}
	s := &Session{
		client:    client,
		owned:     owned,
		id:        id,
		cfg:       cfg,
		keeper:    core.NewKeeper(sent, cfg.ttl, cfg.margin),
		checkNow:  make(chan struct{}, 1),
		held:      make(map[string]*Grant),
		delays:    make(map[string]time.Duration),
		abandoned: make(map[string]leftover),
	}
	if cfg.logger != nil {
		s.keeper.SetObservers(core.LogObserver(cfg.logger, "store", "consul", "session", id))
	}
	s.keeper.SetObservers(cfg.observers...)
	s.bg = core.NewBackground(s.keeper.Context())
	bctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.tasks.Add(2)
	go s.renew(bctx)
	go s.watch(bctx)
	return s, nil
}

// createSession creates a session with the fields of body, every one
// explicit (the Go API omits a zero LockDelay, and the server then applies
// 15 s), sending it again while Consul refuses it without applying it (see
// refused), within requestTimeout. sent is when the last attempt was sent.
func createSession(ctx context.Context, client *api.Client, body map[string]any) (id string, sent time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var out struct{ ID string }
	_ = core.Backoff{Final: func(err error) bool { return !refused(err) }}.Retry(ctx, func(ctx context.Context) error {
		sent = time.Now()
		_, err = client.Raw().Write("/v1/session/create", body, &out, writeOpts(ctx))
		return err
	})
	if err == nil && out.ID == "" {
		err = errors.New("empty session ID in the answer")
	}
	return out.ID, sent, err
}

// ceilMillis is d in milliseconds, rounded up.
func ceilMillis(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

func writeOpts(ctx context.Context) *api.WriteOptions { return (&api.WriteOptions{}).WithContext(ctx) }

// renew renews the session every TTL/3, and retries a failed renewal with
// the backends' one backoff (core.Backoff) until the keeper's deadline ends
// the session; each attempt times out at that deadline, or after
// requestTimeout. Each acknowledged renewal moves the deadline to its send
// time + TTL - margin, and is followed by a check of the held keys (see
// checkKeys), which also runs when asked through checkNow. An answer that
// the session does not exist ends it at once.
func (s *Session) renew(ctx context.Context) {
	defer s.tasks.Done()
	period := s.cfg.ttl / 3
	timer := time.NewTimer(period)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.keeper.Context().Done():
			return
		case <-s.checkNow:
			s.checkKeys(ctx, period/2)
			continue
		case <-timer.C:
		}
		var sent time.Time
		rctx, cancel := s.bind(ctx)
		err := core.Backoff{Final: func(err error) bool { return errors.Is(err, errSessionGone) }}.Retry(rctx, func(ctx context.Context) error {
			sent = time.Now()
			deadline := s.keeper.Deadline()
			if d := sent.Add(requestTimeout); d.Before(deadline) {
				deadline = d
			}
			ctx, cancel := context.WithDeadline(ctx, deadline)
			ttl, err := s.renewOnce(ctx)
			cancel()
			switch {
			case err == nil:
				s.keeper.Renewed(sent, ttl, s.cfg.margin)
			case !errors.Is(err, errSessionGone):
				s.keeper.RenewalFailed(fmt.Errorf("holdfast/consul: renew session %s: %w", s.id, err))
			}
			return err
		})
		cancel()
		switch {
		case err == nil:
			s.checkKeys(ctx, period/2) // never delays the next renewal
			timer.Reset(period - time.Since(sent))
		case errors.Is(err, errSessionGone):
			s.keeper.End(sessionLost(s.id, "does not exist any more (renewal answered 404)"))
			return
		default:
			return // the session ended (ctx or the keeper's deadline)
		}
	}
}

// renewOnce sends one renewal and returns the TTL Consul counts down: what it
// answered, but never more than what was asked.
func (s *Session) renewOnce(ctx context.Context) (time.Duration, error) {
	var entries []*api.SessionEntry
	_, err := s.client.Raw().Write("/v1/session/renew/"+s.id, nil, &entries, writeOpts(ctx))
	switch {
	case statusCode(err) == http.StatusNotFound:
		return 0, errSessionGone
	case err != nil:
		return 0, err
	case len(entries) == 0:
		return 0, errors.New("empty renewal answer")
	}
	ttl := s.cfg.ttl
	if d, err := time.ParseDuration(entries[0].TTL); err == nil && d > 0 && d < ttl {
		ttl = d
	}
	return ttl, nil
}

// checkSoon asks for a check of the held keys now (after a guarded write or
// an Unlock found a key of ours gone), without waiting for it.
func (s *Session) checkSoon() {
	select {
	case s.checkNow <- struct{}{}:
	default:
	}
}

// checkKeys reads every lock key the session holds a grant on, 64 to a
// read-only transaction, and ends the grants whose key our session no longer
// holds (deleted, or taken over by another session, from outside) with a
// cause wrapping holdfast.ErrLost. Errors are ignored: the next check, or
// the keeper's deadline, covers them. It takes at most limit.
func (s *Session) checkKeys(ctx context.Context, limit time.Duration) {
	if !keyCheck() {
		return
	}
	s.mu.Lock()
	grants := slices.Collect(maps.Values(s.held))
	s.mu.Unlock()
	if len(grants) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for batch := range slices.Chunk(grants, maxCheckOps) {
		ops := make(api.TxnOps, len(batch))
		for i, g := range batch {
			ops[i] = kvOp(api.KVGetOrEmpty, g.Key())
		}
		resp, err := s.txn(ctx, ops)
		if err != nil || len(resp.Results) != len(batch) {
			return
		}
		for i, g := range batch {
			if e := resp.Results[i].KV; e != nil && e.Key == g.Key() && e.Session != s.id {
				g.lose(e)
			}
		}
	}
}

// watch follows the session with a blocking query, so that a session
// destroyed or invalidated in Consul ends at once here, rather than at the
// next renewal. Errors never end the session (the keeper's deadline does
// that): transient ones are retried (core.Backoff), and a refusal (an ACL
// without session:read, say) stops the watch, leaving the renewals alone in
// charge.
func (s *Session) watch(ctx context.Context) {
	defer s.tasks.Done()
	if !sessionWatch() {
		return
	}
	ctx, cancel := s.bind(ctx)
	defer cancel()
	var index uint64
	for {
		var entry *api.SessionEntry
		var meta *api.QueryMeta
		err := core.Backoff{Attempt: blockTimeout(monitorWait), Final: queryRefused}.Retry(ctx, func(ctx context.Context) (err error) {
			q := &api.QueryOptions{WaitIndex: index, WaitTime: monitorWait}
			entry, meta, err = s.client.Session().Info(s.id, q.WithContext(ctx))
			return err
		})
		if err != nil {
			return
		}
		if entry == nil {
			s.keeper.End(sessionLost(s.id, "was destroyed or invalidated"))
			return
		}
		index = meta.LastIndex
	}
}

// sleep waits for d or until ctx is done, and reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ID returns the Consul session ID.
func (s *Session) ID() string { return s.id }

// Client returns the Consul client the session uses.
func (s *Session) Client() *api.Client { return s.client }

// TTL returns the session TTL.
func (s *Session) TTL() time.Duration { return s.cfg.ttl }

// Context is cancelled when the session ends; context.Cause tells why (an
// error wrapping holdfast.ErrSessionLost, or holdfast.ErrSessionClosed after
// Close). Every grant's context is a child of it.
func (s *Session) Context() context.Context { return s.keeper.Context() }

// Err returns nil while the session is alive, and why it ended after.
func (s *Session) Err() error { return s.keeper.Err() }

// Close stops the renewals, cancels every grant of the session (cause
// wrapping holdfast.ErrLost and holdfast.ErrSessionClosed), stops the
// acquisitions in progress and the background cleanups, releases the locks
// the session still holds in Consul and removes what failed acquisitions
// left (so that no lock-delay applies to those keys), destroys the session,
// and closes the client's connections if Dial made it. It is idempotent;
// later use of the session fails with holdfast.ErrSessionClosed. Its
// requests are bounded by 10 s; if one fails, Consul still invalidates the
// session on its own within 2 x TTL.
func (s *Session) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Session) close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.keeper.End(fmt.Errorf("%w: %w", holdfast.ErrLost, holdfast.ErrSessionClosed))
	s.stop()
	s.ops.Wait()
	s.bg.Wait()
	s.tasks.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	s.mu.Lock()
	held := slices.Collect(maps.Values(s.held))
	left := slices.Collect(maps.Values(s.abandoned))
	s.mu.Unlock()
	var errs []error
	for _, g := range held {
		if err := g.rel.drop(ctx, g); err != nil && !errors.Is(err, holdfast.ErrNotHeld) {
			errs = append(errs, err)
		}
	}
	for _, l := range left {
		if err := s.clean(ctx, l); err != nil {
			errs = append(errs, err)
		}
	}
	// Destroying is idempotent: an attempt that fails (refused, or its
	// answer lost) is sent again until closeTimeout.
	var derr error
	_ = core.Backoff{Attempt: core.AttemptTimeout, Final: queryRefused}.Retry(ctx, func(actx context.Context) error {
		_, derr = s.client.Session().Destroy(s.id, writeOpts(actx))
		return derr
	})
	if derr != nil {
		errs = append(errs, apiError("destroy session "+s.id, derr))
	} else {
		// A request of a failed acquisition may have landed between the
		// cleanup above and the destroy (one that lands later fails: the
		// session is gone): what it made stays, freed, with Behavior
		// release. Remove it once more (best effort).
		for _, l := range left {
			_ = s.clean(ctx, l)
		}
	}
	if s.owned != nil {
		s.owned.CloseIdleConnections()
	}
	return errors.Join(errs...)
}

// begin registers an acquisition, so that Close waits for it to stop.
func (s *Session) begin() (end func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("%w: consul session %s", holdfast.ErrSessionClosed, s.id)
	}
	if err := s.keeper.Err(); err != nil {
		return nil, err
	}
	s.ops.Add(1)
	return s.ops.Done, nil
}

// alive returns nil if the session can still be used.
func (s *Session) alive() error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return fmt.Errorf("%w: consul session %s", holdfast.ErrSessionClosed, s.id)
	}
	return s.keeper.Err()
}

// bind returns a context that ends with ctx or with the session, whichever
// comes first; in the second case its cause is the session's.
func (s *Session) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.keeper.Context(), func() { cancel(s.keeper.Err()) })
	return bctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// hold records that g holds its lock key in Consul.
func (s *Session) hold(g *Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held[g.Key()] = g
}

// forget records that g no longer holds its lock key.
func (s *Session) forget(g *Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[g.Key()] == g {
		delete(s.held, g.Key())
	}
}

// ended ends the session after Consul said, in answer to a request, that it
// does not exist, and returns the session's cause.
func (s *Session) ended() error {
	s.keeper.End(sessionLost(s.id, "no longer exists"))
	return s.keeper.Err()
}

// lockDelayOf returns the lock-delay of another session, if it can be
// learnt: from a cache, or from Consul while the session still exists.
func (s *Session) lockDelayOf(ctx context.Context, id string) (time.Duration, bool) {
	s.mu.Lock()
	d, ok := s.delays[id]
	s.mu.Unlock()
	if ok {
		return d, true
	}
	ictx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	entry, _, err := s.client.Session().Info(id, (&api.QueryOptions{}).WithContext(ictx))
	if err != nil || entry == nil {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.delays) >= maxDelayCache {
		clear(s.delays)
	}
	s.delays[id] = entry.LockDelay
	return entry.LockDelay, true
}
