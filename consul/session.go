package consul

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

// The session TTLs (MinTTL, the server's default session_ttl_min, to
// MaxTTL) and lock-delays (0 to MaxLockDelay) Consul accepts.
const (
	MinTTL       = 10 * time.Second
	MaxTTL       = 24 * time.Hour
	MaxLockDelay = 60 * time.Second
)

const (
	defaultTTL       = 15 * time.Second
	defaultLockDelay = 15 * time.Second // Consul's
	requestTimeout   = 10 * time.Second // every non-blocking request, and Close's
	blockWait        = 5 * time.Second  // blocking queries on lock and queue keys
	monitorWait      = 10 * time.Second // the blocking query on the session itself
	maxDelayCache    = 1024             // other sessions' lock-delays cached
	maxCheckOps      = 64               // keys per read of Session.checkKeys
	dialTimeout      = 5 * time.Second  // TCP connect and TLS handshake of Dial's client
)

type sessionConfig struct {
	core.SessionOptions
	ttl        time.Duration
	lockDelay  time.Duration
	behavior   string
	nodeChecks []string
	name       string
	dial       dialConfig // options for Dial's own client (see tls.go)
}

// SessionOption configures NewSession.
type SessionOption func(*sessionConfig)

// WithTTL sets the session TTL (default 15 s; MinTTL to MaxTTL, else an
// error wrapping holdfast.ErrInvalidTTL). A crashed holder keeps its locks
// until Consul invalidates its session, TTL to 2 x TTL after its last renewal.
func WithTTL(d time.Duration) SessionOption { return func(c *sessionConfig) { c.ttl = d } }

// WithMargin sets the safety margin (default TTL/5; 0 to TTL/2, else an
// error wrapping holdfast.ErrInvalidTTL): grant contexts end at (send time
// of the last acknowledged renewal) + TTL - margin on the monotonic clock,
// before Consul can invalidate the session if the clocks' rates differ by
// less than margin/TTL and only the TTL invalidates it.
func WithMargin(d time.Duration) SessionOption {
	return func(c *sessionConfig) { c.Margin, c.MarginSet = d, true }
}

// WithLockDelay sets the session's lock-delay (default 15 s, Consul's): for
// that long after Consul invalidates the session, nobody can acquire the
// keys it held (a normal Unlock imposes none). 0 disables it; negative or
// over MaxLockDelay is an error wrapping holdfast.ErrInvalidArgument.
func WithLockDelay(d time.Duration) SessionOption { return func(c *sessionConfig) { c.lockDelay = d } }

// WithBehavior sets what Consul does to the session's keys when it
// invalidates it: api.SessionBehaviorDelete (default) or
// api.SessionBehaviorRelease (api.Lock's: they stay, free, until the next
// contender deletes them); else an error wrapping holdfast.ErrInvalidArgument.
func WithBehavior(b string) SessionOption { return func(c *sessionConfig) { c.behavior = b } }

// WithNodeChecks ties the session to health checks of the agent's node
// (such as "serfHealth"; default none, so only the TTL, which the local
// deadline anticipates, invalidates it). A failed check invalidates the
// session at once, with no notice to a holder that may still run: then rely
// on Grant.Token or Grant.Txn, not on the context.
func WithNodeChecks(ids ...string) SessionOption {
	ids = append([]string{}, ids...)
	return func(c *sessionConfig) { c.nodeChecks = ids }
}

// WithSessionName sets the session's name in Consul: n, a space and a
// random suffix, by which a creation whose answer was lost is found
// (default n "holdfast").
func WithSessionName(n string) SessionOption { return func(c *sessionConfig) { c.name = n } }

// WithObserver adds an observer of the session's events (package metrics
// has one for Prometheus), called synchronously: it must not block.
func WithObserver(o holdfast.Observer) SessionOption {
	return func(c *sessionConfig) { c.Observers = append(c.Observers, o) }
}

// WithLogger logs the session's events to l (grants and the end Info,
// releases Debug, losses and renewal failures Warn), with the attributes
// store=consul and session=<ID>. Without it, holdfast logs nothing.
func WithLogger(l *slog.Logger) SessionOption {
	return func(c *sessionConfig) { c.Logger = cmp.Or(l, c.Logger) }
}

func newSessionConfig(opts []SessionOption) (sessionConfig, error) {
	c := sessionConfig{
		ttl:        defaultTTL,
		lockDelay:  defaultLockDelay,
		behavior:   api.SessionBehaviorDelete,
		name:       "holdfast",
		nodeChecks: []string{},
	}
	options.Apply(&c, opts)
	switch {
	case c.ttl < MinTTL || c.ttl > MaxTTL:
		return c, fmt.Errorf("%w: %v is outside Consul's session TTL range [%v, %v]", holdfast.ErrInvalidTTL, c.ttl, MinTTL, MaxTTL)
	case c.lockDelay < 0 || c.lockDelay > MaxLockDelay:
		return c, fmt.Errorf("%w: lock-delay %v is not between 0 and %v", holdfast.ErrInvalidArgument, c.lockDelay, MaxLockDelay)
	case c.behavior != api.SessionBehaviorRelease && c.behavior != api.SessionBehaviorDelete:
		return c, fmt.Errorf("%w: session behavior %q is neither %q nor %q", holdfast.ErrInvalidArgument, c.behavior, api.SessionBehaviorRelease, api.SessionBehaviorDelete)
	case slices.Contains(c.nodeChecks, ""):
		return c, fmt.Errorf("%w: empty node check ID", holdfast.ErrInvalidArgument)
	}
	err := c.dial.check()
	if err == nil {
		c.Margin, err = core.Margin(c.ttl, c.Margin, c.MarginSet)
	}
	return c, err
}

// Session is a Consul session renewed in the background, shared by every
// lock taken through it, safe for concurrent use. When it cannot be renewed
// before its safe local deadline, Consul says it is gone, or it is closed,
// every grant's context is cancelled with the reason; it does not come back.
type Session struct {
	client *api.Client
	owned  *http.Transport // the transport of a client made by Dial, else nil
	id     string
	cfg    sessionConfig
	keeper *core.Keeper
	bg     *core.Background
	names  core.Names

	stop     context.CancelFunc // stops renew and watch
	tasks    sync.WaitGroup     // renew and watch
	checkNow chan struct{}      // asks renew to check the held keys now

	mu        sync.Mutex
	closed    bool
	ops       sync.WaitGroup           // acquisitions in progress
	held      map[string]*Grant        // by lock key: grants held in Consul
	delays    map[string]time.Duration // lock-delay of other sessions, by ID
	abandoned map[string]leftover      // by lock name: cleanups for Close to try again

	closeOnce sync.Once
	closeErr  error
}

// Dial opens a session (as NewSession) on a client of its own for the
// agent at addr ("host:port", "https://host:8501", or "" for the
// environment's), its token and TLS from the environment unless WithToken,
// WithTLS or WithTLSFiles say otherwise. Connecting times out after 5 s.
func Dial(ctx context.Context, addr string, opts ...SessionOption) (*Session, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	sc, err := newSessionConfig(opts)
	if err != nil {
		return nil, err
	}
	client, cfg, tr, err := sc.dial.client(addr)
	if err != nil {
		return nil, err
	}
	s, err := openSession(ctx, client, tr, sc)
	if err != nil {
		tr.CloseIdleConnections()
		return nil, explainTLS(err, cfg.Scheme, cfg.Address, tr.TLSClientConfig)
	}
	return s, nil
}

// NewSession creates a Consul session through client (which stays the
// caller's) and renews it until Close, or until it is lost. ctx bounds only
// the creation. Bad options, a nil client and the Dial-only options are
// errors wrapping holdfast.ErrInvalidArgument, before any request; an ACL
// refusal wraps holdfast.ErrPermissionDenied.
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
	if err := cfg.dial.DialOnly("the token and TLS (api.Config Token, TLSConfig)"); err != nil {
		return nil, err
	}
	return openSession(ctx, client, nil, cfg)
}

func openSession(ctx context.Context, client *api.Client, owned *http.Transport, cfg sessionConfig) (*Session, error) {
	cfg.dial = dialConfig{} // nothing of the credentials stays in the session
	lockDelay := fmt.Sprintf("%dms", (cfg.lockDelay + time.Millisecond - 1).Milliseconds())
	body := map[string]any{"TTL": cfg.ttl.String(), "LockDelay": lockDelay, "Behavior": cfg.behavior, "NodeChecks": cfg.nodeChecks}
	id, sent, err := createSession(ctx, client, cfg.name+" "+rand.Text(), body)
	if err != nil {
		return nil, err
	}
	s := &Session{
		client:    client,
		owned:     owned,
		id:        id,
		cfg:       cfg,
		keeper:    cfg.NewKeeper(sent, cfg.ttl, "store", "consul", "session", id),
		checkNow:  make(chan struct{}, 1),
		held:      make(map[string]*Grant),
		delays:    make(map[string]time.Duration),
		abandoned: make(map[string]leftover),
	}
	s.bg = core.NewBackground(s.keeper.Context())
	var bctx context.Context
	bctx, s.stop = context.WithCancel(context.Background())
	s.tasks.Add(2)
	go s.renew(bctx)
	go s.watch(bctx)
	return s, nil
}

// createSession creates a session called name with body's other fields,
// all explicit (the Go API omits a zero LockDelay), within requestTimeout
// (see write); sent: when the last attempt went. One created with its
// answer lost is found by its name and taken; if it is not found, the
// error is answerLost's: it may still be applied.
func createSession(ctx context.Context, client *api.Client, name string, body map[string]any) (id string, sent time.Time, err error) {
	body["Name"] = name
	var out struct{ ID string }
	if sent, err = write(ctx, client, "/v1/session/create", body, &out); err == nil && out.ID == "" {
		err = errors.New("empty session ID in the answer")
	}
	if answerLost(err) { // it may have applied: the session of that name is ours
		if found, lerr := sessionNamed(ctx, client, name); lerr == nil && found != "" {
			out.ID, err = found, nil
		}
	}
	if err != nil {
		return "", sent, apiError("create session "+name, err)
	}
	return out.ID, sent, nil
}

// sessionNamed returns the ID of the session called name ("": none),
// within requestTimeout; a name with its random suffix names one at most.
func sessionNamed(ctx context.Context, client *api.Client, name string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	all, _, err := client.Session().List((&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return "", apiError("list sessions", err)
	}
	for _, e := range all {
		if e.Name == name {
			return e.ID, nil
		}
	}
	return "", nil
}

func writeOpts(ctx context.Context) *api.WriteOptions { return (&api.WriteOptions{}).WithContext(ctx) }

// renew renews the session every TTL/3, retrying until the keeper's
// deadline, and checks the held keys after each renewal and on checkNow.
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
		rctx, cancel := core.Bind(ctx, s.keeper.Context())
		err := core.Backoff{Final: func(err error) bool { return errors.Is(err, errSessionGone) }}.Retry(rctx, func(ctx context.Context) error {
			sent = time.Now()
			return s.renewOnce(ctx, sent)
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

// renewOnce sends one renewal at sent, bounded by the keeper's deadline,
// and tells the keeper the outcome (the TTL answered, at most asked).
func (s *Session) renewOnce(ctx context.Context, sent time.Time) error {
	deadline := s.keeper.Deadline()
	if d := sent.Add(requestTimeout); d.Before(deadline) {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var entries []*api.SessionEntry
	_, err := s.client.Raw().Write("/v1/session/renew/"+s.id, nil, &entries, writeOpts(ctx))
	switch {
	case statusCode(err) == http.StatusNotFound:
		return errSessionGone
	case err == nil && len(entries) == 0:
		err = errors.New("empty renewal answer")
	}
	if err != nil {
		s.keeper.RenewalFailed(fmt.Errorf("holdfast/consul: renew session %s: %w", s.id, err))
		return err
	}
	ttl := s.cfg.ttl
	if d, err := time.ParseDuration(entries[0].TTL); err == nil && d > 0 && d < ttl {
		ttl = d
	}
	s.keeper.Renewed(sent, ttl, s.cfg.Margin)
	return nil
}

// checkSoon asks renew for a check of the held keys now.
func (s *Session) checkSoon() {
	select {
	case s.checkNow <- struct{}{}:
	default:
	}
}

// checkKeys reads the held grants' keys, 64 to a transaction, within limit,
// and ends those our session no longer holds; errors wait for the next check.
func (s *Session) checkKeys(ctx context.Context, limit time.Duration) {
	if !keyCheck() {
		return
	}
	s.mu.Lock()
	grants := slices.Collect(maps.Values(s.held))
	s.mu.Unlock()
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
// destroyed or invalidated in Consul ends at once; a refusal (an ACL
// without session:read) leaves the renewals alone in charge.
func (s *Session) watch(ctx context.Context) {
	defer s.tasks.Done()
	if !sessionWatch() {
		return
	}
	ctx, cancel := core.Bind(ctx, s.keeper.Context())
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

// ID returns the Consul session ID.
func (s *Session) ID() string { return s.id }

// Client returns the Consul client the session uses.
func (s *Session) Client() *api.Client { return s.client }

// TTL returns the session TTL.
func (s *Session) TTL() time.Duration { return s.cfg.ttl }

// Context is cancelled when the session ends, every grant's with it;
// context.Cause wraps holdfast.ErrSessionLost or ErrSessionClosed.
func (s *Session) Context() context.Context { return s.keeper.Context() }

// Err returns nil while the session is alive, and why it ended after.
func (s *Session) Err() error { return s.keeper.Err() }

// Close ends every grant (cause wrapping holdfast.ErrLost and
// ErrSessionClosed) and acquisition, releases the session's keys (so no
// lock-delay applies) and destroys it, within 10 s (else Consul invalidates
// it within 2 x TTL). It is idempotent.
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
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	s.mu.Lock()
	held, left := slices.Collect(maps.Values(s.held)), slices.Collect(maps.Values(s.abandoned))
	s.mu.Unlock()
	var errs []error
	for _, g := range held {
		if err := g.rel.drop(ctx, g); err != nil && !errors.Is(err, holdfast.ErrNotHeld) {
			errs = append(errs, err)
		}
	}
	for _, l := range left {
		errs = append(errs, l.clean(ctx))
	}
	// Destroy, sent again until it is answered (it is idempotent).
	var derr error
	_ = core.Backoff{Attempt: core.AttemptTimeout, Final: queryRefused}.Retry(ctx, func(actx context.Context) error {
		_, derr = s.client.Session().Destroy(s.id, writeOpts(actx))
		return derr
	})
	if derr != nil {
		errs = append(errs, apiError("destroy session "+s.id, derr))
	} else {
		// A request of a failed acquisition may have landed after its
		// cleanup and before the destroy, leaving a freed key: once more.
		for _, l := range left {
			_ = l.clean(ctx)
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
	if err := s.aliveLocked(); err != nil {
		return nil, err
	}
	s.ops.Add(1)
	return s.ops.Done, nil
}

// alive returns nil if the session can still be used.
func (s *Session) alive() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.aliveLocked()
}

func (s *Session) aliveLocked() error {
	if s.closed {
		return fmt.Errorf("%w: consul session %s", holdfast.ErrSessionClosed, s.id)
	}
	return s.keeper.Err()
}

// hold and forget record that g holds its key in Consul, and no longer.
func (s *Session) hold(g *Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held[g.Key()] = g
}

func (s *Session) forget(g *Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[g.Key()] == g {
		delete(s.held, g.Key())
	}
}

// ended ends the session, which Consul said is gone, and returns its cause.
func (s *Session) ended() error {
	s.keeper.End(sessionLost(s.id, "no longer exists"))
	return s.keeper.Err()
}

// lockDelayOf returns the lock-delay of another session, cached, or from
// Consul while that session exists.
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
