package etcd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

// MinTTL is the shortest lease TTL etcd grants with its default election
// timeout (1.5 x 1 s election timeout, rounded up to whole seconds).
const MinTTL = 2 * time.Second

const (
	// defaultTTL is the session TTL when WithTTL is not given.
	defaultTTL = 15 * time.Second
	// maxTTL is the longest lease TTL etcd accepts.
	maxTTL = 9_000_000_000 * time.Second
	// connectTimeout bounds NewSession (and Dial) when their context has
	// no deadline: how long to keep trying to reach etcd and grant the
	// session's lease before giving up with the last connection error.
	connectTimeout = 5 * time.Second
)

const (
	// retryPause is the longest pause before a failed renewal is retried.
	retryPause = 100 * time.Millisecond
	// maxRenewAttempt bounds one keepalive attempt (with TTL/3 if shorter),
	// so that an attempt stuck on a frozen member gives way to the next one,
	// which may reach a healthy member, well before the local deadline.
	maxRenewAttempt = 2 * time.Second
)

type sessionConfig struct {
	core.SessionOptions
	ttl  time.Duration
	dial dialConfig // options for Dial's own client (see tls.go)
}

// SessionOption configures NewSession.
type SessionOption func(*sessionConfig)

// WithTTL sets the lease TTL (default 15 s). It must be a whole number of
// seconds, at least MinTTL (at most 9e9 s, etcd's bound). A holder that
// crashes keeps its locks for at most the TTL; a longer TTL tolerates
// longer pauses and partitions before a grant is lost.
func WithTTL(ttl time.Duration) SessionOption { return func(c *sessionConfig) { c.ttl = ttl } }

// WithMargin sets the safety margin of the local deadline (default TTL/5; at
// most TTL/2). Every grant's context is cancelled at
//
//	(send time of the last acknowledged keepalive) + TTL - margin
//
// on this process's monotonic clock. The server cannot expire the lease
// earlier than TTL after it received that keepalive, which is after it was
// sent, so the holder is told before any other client can be granted its
// locks, provided that this clock and the server's run at rates that differ
// by less than margin/TTL (20% by default) and that the holder acts on the
// cancellation within the rest of the margin. Clocks need not be
// synchronized, and wall-clock jumps do not matter.
func WithMargin(m time.Duration) SessionOption {
	return func(c *sessionConfig) { c.Margin, c.MarginSet = m, true }
}

// WithObserver adds an observer of the session's events (grants, their
// ends, renewal failures, the session's end): package metrics provides one
// for Prometheus. Observers are called synchronously and must not block.
func WithObserver(o holdfast.Observer) SessionOption {
	return func(c *sessionConfig) { c.Observers = append(c.Observers, o) }
}

// WithLogger logs the session's events to l with log/slog: grants (Info),
// releases (Debug), losses with their cause (Warn), renewal failures
// (Warn), and the session's end (Info when closed, Warn when lost), each
// with the attributes store=etcd and lease=<lease ID in hex>. Without it,
// holdfast logs nothing.
//
// With a logger, the session also asks each endpoint for its server version
// once, in the background, and logs a warning (Warn, "etcd server revokes
// leases early") for a version known to let a leader that was paused or
// cut off revoke leases it believes expired after it resumes (etcd issues
// #15247 and #12528, fixed by #16822 in 3.4.31, 3.5.13 and 3.6.0): on such a
// server, another client may be granted a lock a few milliseconds before
// the holder's grant context ends, so only fencing keeps the resource
// safe (see the README's guarantees).
func WithLogger(l *slog.Logger) SessionOption {
	return func(c *sessionConfig) { c.Logger = cmp.Or(l, c.Logger) }
}

func newSessionConfig(opts []SessionOption) (sessionConfig, error) {
	c := sessionConfig{ttl: defaultTTL}
	options.Apply(&c, opts)
	switch {
	case c.ttl < MinTTL || c.ttl > maxTTL:
		return c, fmt.Errorf("%w: %v is outside etcd's range [%v, %v]", holdfast.ErrInvalidTTL, c.ttl, MinTTL, maxTTL)
	case c.ttl%time.Second != 0:
		return c, fmt.Errorf("%w: %v is not a whole number of seconds (etcd lease TTLs are in seconds)", holdfast.ErrInvalidTTL, c.ttl)
	}
	if err := c.dial.check(); err != nil {
		return c, err
	}
	var err error
	c.Margin, err = core.Margin(c.ttl, c.Margin, c.MarginSet)
	return c, err
}

// Session is an etcd lease kept alive in the background. Every grant taken
// through a Session is attached to its lease, so one keepalive stream serves
// any number of locks, and one watch stream watches all their keys (a
// revoked lease or a deleted key ends the grant within milliseconds; a held
// grant costs no goroutine). When the lease cannot be renewed in time, is revoked,
// or the Session is closed, the context of every grant is cancelled with the
// reason.
//
// A Session is safe for concurrent use.
type Session struct {
	client  *clientv3.Client
	owned   bool // created by Dial: closed by Close
	lease   clientv3.LeaseID
	watcher *watcher
	cfg     sessionConfig
	keeper  *core.Keeper
	bg      *core.Background
	names   core.Names
	using   sync.Map // name -> the key its slot's holder uses (see Session.slot)

	stop      context.CancelFunc
	renewDone chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// Dial connects to the etcd cluster at endpoints (such as
// "http://127.0.0.1:2379") and returns a Session on a client of its own,
// which Close closes. ctx bounds the connection, the authentication and the
// lease grant (without a deadline, 5 s). The client keeps its connections
// checked with gRPC keepalives (every 10 s, 3 s timeout).
//
// For a secured cluster, WithTLS or WithTLSFiles (server authentication by
// a CA, and mutual TLS with a client certificate) and WithCredentials (etcd
// user and password) configure the client; they apply to Dial only. A
// wrong password or an unknown user is an error wrapping
// holdfast.ErrPermissionDenied. A server whose certificate the CA does not
// vouch for, or that refuses ours, cannot be connected to: Dial then fails
// when ctx (or those 5 s) ends, saying what the TLS handshake
// answered ("certificate signed by unknown authority", "certificate
// required"...). No error ever contains the password or key material. For
// other client settings, create the client with clientv3.New and call
// NewSession.
func Dial(ctx context.Context, endpoints []string, opts ...SessionOption) (*Session, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%w: no etcd endpoints", holdfast.ErrInvalidArgument)
	}
	cfg, err := newSessionConfig(opts)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, connectTimeout)
		defer cancel()
	}
	client, err := newClient(ctx, endpoints, &cfg.dial)
	if err != nil {
		return nil, err
	}
	s, err := start(ctx, client, cfg)
	if err != nil {
		client.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// NewSession grants a lease on client and keeps it alive until Close or
// until it is lost. ctx bounds only the lease grant (without a deadline,
// 5 s), and when etcd cannot be reached in time the
// error says why (the last connection error, such as "connection refused").
// The caller keeps ownership of client: Close does not close it. The options
// that apply to Dial only (WithTLS, WithTLSFiles, WithCredentials) are
// refused with an error wrapping holdfast.ErrInvalidArgument: configure the
// client instead. A client whose user lacks a permission gets errors
// wrapping holdfast.ErrPermissionDenied.
func NewSession(ctx context.Context, client *clientv3.Client, opts ...SessionOption) (*Session, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil etcd client", holdfast.ErrInvalidArgument)
	}
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	cfg, err := newSessionConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := cfg.dial.DialOnly("TLS and credentials (clientv3.Config TLS, Username, Password)"); err != nil {
		return nil, err
	}
	return start(ctx, client, cfg)
}

// start grants the session's lease on client and starts its renewals.
func start(ctx context.Context, client *clientv3.Client, cfg sessionConfig) (*Session, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, connectTimeout)
		defer cancel()
	}
	diagnose := cfg.dial.diagnoseAhead(ctx, client.Endpoints())
	sent := time.Now()
	lease, ttl, err := grantLease(ctx, client, cfg.ttl)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("holdfast/etcd: grant lease: %w%s", ctx.Err(), diagnose(ctx.Err()))
		}
		diagnose(nil)
		return nil, fmt.Errorf("holdfast/etcd: grant lease: %w", storeErr(err))
	}
	diagnose(nil)
	cfg.dial = dialConfig{} // nothing of the credentials stays in the session
	s := &Session{
		client:    client,
		lease:     lease,
		cfg:       cfg,
		keeper:    cfg.NewKeeper(sent, ttl, "store", "etcd", "lease", fmt.Sprintf("%x", int64(lease))),
		renewDone: make(chan struct{}),
	}
	s.bg = core.NewBackground(s.keeper.Context())
	if cfg.Logger != nil {
		s.bg.Go(s.warnEarlyRevoke)
	}
	s.watcher = newWatcher(s)
	var rctx context.Context
	rctx, s.stop = context.WithCancel(context.Background())
	go s.renew(rctx)
	return s, nil
}

// grantLease grants a lease of ttl under an ID of our own, through
// clientv3's retrying lease client: a retry after an answer lost finds the
// ID exists and takes that lease (a random 63-bit ID is no other lease's),
// instead of granting a second one that would stay until its TTL. It
// returns the ID and the TTL granted (at most ttl).
func grantLease(ctx context.Context, client *clientv3.Client, ttl time.Duration) (clientv3.LeaseID, time.Duration, error) {
	id := clientv3.LeaseID(rand.Int64N(math.MaxInt64) + 1)
	// WaitForReady and ContextError as clientv3's own Grant: without a
	// connection it waits for one until ctx ends (and the session's error
	// says why there was none).
	resp, err := clientv3.RetryLeaseClient(client).LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: int64(id), TTL: int64(ttl / time.Second)}, grpc.WaitForReady(true))
	switch err := rpctypes.Error(clientv3.ContextError(ctx, err)); {
	case errors.Is(err, rpctypes.ErrLeaseExist):
		return id, ttl, nil
	case err != nil:
		return id, 0, err
	}
	return id, grantedTTL(ttl, resp.TTL), nil
}

// warnEarlyRevoke asks each endpoint for its version (each request bounded
// by 5 s) and logs a warning for a version that revokes leases early (see
// WithLogger).
func (s *Session) warnEarlyRevoke(ctx context.Context) {
	for _, ep := range s.client.Endpoints() {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := s.client.Status(sctx, ep)
		cancel()
		if err == nil && revokesEarly(resp.Version) {
			s.cfg.Logger.Warn("etcd server revokes leases early: after a paused or cut-off leader resumes, a lock may be granted to another client before the holder's grant context ends; fence the resource, or run etcd 3.4.31, 3.5.13, 3.6.0 or later (etcd #15247, fixed by #16822)",
				"store", "etcd", "endpoint", ep, "version", resp.Version)
		}
	}
}

// revokesEarly reports whether etcd server version v (such as "3.4.23")
// lets an old leader revoke leases after it resumes: every version before
// 3.4.31, and 3.5 before 3.5.13. An unreadable version is not reported.
func revokesEarly(v string) bool {
	var major, minor, patch int
	if n, _ := fmt.Sscanf(v, "%d.%d.%d", &major, &minor, &patch); n < 2 {
		return false
	}
	switch {
	case major != 3:
		return major < 3
	case minor < 4:
		return true
	case minor == 4:
		return patch < 31
	case minor == 5:
		return patch < 13
	}
	return false
}

// grantedTTL is the TTL the server counts down: what it answered, but never
// more than what was asked (a conservative deadline is always safe).
func grantedTTL(asked time.Duration, answered int64) time.Duration {
	if d := time.Duration(answered) * time.Second; d > 0 && d < asked {
		return d
	}
	return asked
}

// renew sends a keepalive every TTL/3 and retries failed ones with the
// backends' one backoff (core.Backoff, pauses capped at retryPause: the
// deadline is near), until the session ends. Each acknowledged keepalive
// moves the local deadline to its send time + TTL - margin.
func (s *Session) renew(ctx context.Context) {
	defer close(s.renewDone)
	period := s.cfg.ttl / 3
	timer := time.NewTimer(period)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.keeper.Context().Done():
			return
		case <-s.client.Ctx().Done():
			s.keeper.End(fmt.Errorf("%w: etcd client closed", holdfast.ErrSessionLost))
			return
		case <-timer.C:
		}
		rctx, stop := core.Bind(ctx, s.keeper.Context())
		rctx, stop2 := core.Bind(rctx, s.client.Ctx())
		err := core.Backoff{Max: retryPause, Final: func(err error) bool {
			return errors.Is(err, holdfast.ErrSessionLost)
		}}.Retry(rctx, s.keepAlive)
		stop2()
		stop()
		if errors.Is(err, holdfast.ErrSessionLost) {
			s.keeper.End(err)
			return
		}
		timer.Reset(period)
	}
}

// keepAlive sends one keepalive, bounded by TTL/3 (at most
// maxRenewAttempt) and by the keeper's deadline: one that landed on a
// frozen member gives up in time for the next, which the client's balancer
// sends to another member. It returns an error wrapping
// holdfast.ErrSessionLost if the lease is gone.
func (s *Session) keepAlive(ctx context.Context) error {
	sent := time.Now()
	attempt := min(s.cfg.ttl/3, maxRenewAttempt)
	kctx, cancel := context.WithDeadline(ctx, minTime(s.keeper.Deadline(), sent.Add(attempt)))
	resp, err := s.client.KeepAliveOnce(kctx, s.lease)
	cancel()
	switch {
	case err == nil:
		s.keeper.Renewed(sent, grantedTTL(s.cfg.ttl, resp.TTL), s.cfg.Margin)
		return nil
	case errors.Is(storeErr(err), holdfast.ErrSessionLost):
		return fmt.Errorf("%w: lease %x expired or was revoked", holdfast.ErrSessionLost, int64(s.lease))
	}
	err = fmt.Errorf("holdfast/etcd: keepalive of lease %x: %w", int64(s.lease), storeErr(err))
	s.keeper.RenewalFailed(err) // the keeper's deadline ends the session if this goes on
	return err
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Lease returns the ID of the session's lease.
func (s *Session) Lease() clientv3.LeaseID { return s.lease }

// Client returns the etcd client the session uses.
func (s *Session) Client() *clientv3.Client { return s.client }

// TTL returns the session's lease TTL.
func (s *Session) TTL() time.Duration { return s.cfg.ttl }

// Context is cancelled when the session ends; context.Cause tells why
// (ErrSessionLost, or ErrSessionClosed after Close). Every grant's context is
// a child of it.
func (s *Session) Context() context.Context { return s.keeper.Context() }

// Err returns nil while the session is alive, and why it ended after.
func (s *Session) Err() error { return s.keeper.Err() }

// Close stops the keepalives, cancels every grant of the session (cause
// wrapping ErrLost and ErrSessionClosed), waits for the session's background
// work (which stops at once), and revokes the lease, which deletes every key
// of the session; then it closes the client if Dial created it. It is
// idempotent. If the revoke fails (within min(TTL, 5 s)), the lease still
// expires on its own within TTL.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		s.stop()
		<-s.renewDone
		s.keeper.End(fmt.Errorf("%w: %w", holdfast.ErrLost, holdfast.ErrSessionClosed))
		s.bg.Wait()
		<-s.watcher.done
		ctx, cancel := context.WithTimeout(context.Background(), min(s.cfg.ttl, 5*time.Second))
		defer cancel()
		if _, err := s.client.Revoke(ctx, s.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			s.closeErr = fmt.Errorf("holdfast/etcd: revoke lease %x: %w", int64(s.lease), storeErr(err))
		}
		if s.owned {
			_ = s.client.Close()
		}
	})
	return s.closeErr
}

// alive returns the error to give when the session can no longer be used.
func (s *Session) alive() error {
	if err := s.keeper.Err(); err != nil {
		if errors.Is(err, holdfast.ErrSessionClosed) {
			return holdfast.ErrSessionClosed
		}
		return err
	}
	return nil
}
