package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	hfconsul "github.com/holdfast/holdfast/consul"
	hfetcd "github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/internal/tlsfiles"
	"github.com/holdfast/holdfast/leader"
)

// storeFlags are the flags that say which store to use and how: shared by
// every command that talks to a store.
type storeFlags struct {
	backend   *string
	endpoints *string
	addr      *string
	ttl       *time.Duration
	lockDelay *time.Duration

	// TLS and authentication; see secure. Defaults come from the
	// environment when the flags are used, never as flag defaults: a secret
	// would show in --help.
	cacert   *string
	cert     *string
	key      *string
	user     *string
	password *string
	token    *string

	// Given to every session opened (lock and elect's --metrics-addr and
	// --log), not flags of their own.
	observers []holdfast.Observer
	logger    *slog.Logger

	// opened: a session was opened before (elect --loop opens another
	// after a loss); a refused port then gets etcd's usual connect
	// timeout, time for a restarting store to come back, not a failure at
	// once (failFastRefused).
	opened bool
}

// addStoreFlags declares the store flags on fs. Defaults come from the
// environment variables the native tools read (ETCDCTL_ENDPOINTS,
// ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY, ETCDCTL_USER, ETCDCTL_PASSWORD;
// CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE, CONSUL_CACERT,
// CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY, CONSUL_HTTP_SSL...),
// HOLDFAST_ENDPOINTS and HOLDFAST_BACKEND.
func addStoreFlags(fs *flag.FlagSet) *storeFlags {
	f := addConnFlags(fs)
	f.ttl = fs.Duration("ttl", 0, fmt.Sprintf("session TTL: how long the store keeps a crashed holder's grants (default 15s); etcd: at least %v, whole seconds; Consul: %v to %v, and Consul expires a crashed holder's session between TTL and 2 x TTL (+ --lock-delay); 0 is refused", hfetcd.MinTTL, hfconsul.MinTTL, hfconsul.MaxTTL))
	f.lockDelay = fs.Duration("lock-delay", -1, fmt.Sprintf("Consul only: the session's lock-delay, after which a lock whose holder's session was invalidated can be taken again: 0 (none) to %v (default 15s)", hfconsul.MaxLockDelay))
	return f
}

// addConnFlags declares the store flags but the session's (--ttl,
// --lock-delay): for a command that opens no session.
func addConnFlags(fs *flag.FlagSet) *storeFlags {
	return &storeFlags{
		cacert:    fs.String("cacert", "", "TLS: the CA certificate `FILE` that vouches for the store's servers ($ETCDCTL_CACERT; Consul: $CONSUL_CACERT)"),
		cert:      fs.String("cert", "", "mutual TLS: the client certificate `FILE` ($ETCDCTL_CERT; Consul: $CONSUL_CLIENT_CERT)"),
		key:       fs.String("key", "", "mutual TLS: the private key `FILE` of --cert ($ETCDCTL_KEY; Consul: $CONSUL_CLIENT_KEY)"),
		user:      fs.String("user", "", "etcd only: authenticate as `USER[:PASSWORD]` ($ETCDCTL_USER); prefer $ETCDCTL_PASSWORD to a password on the command line"),
		password:  fs.String("password", "", "etcd only: the `PASSWORD` of --user ($ETCDCTL_PASSWORD); the user name is then taken whole"),
		token:     fs.String("token", "", "Consul only: the ACL `TOKEN` ($CONSUL_HTTP_TOKEN, $CONSUL_HTTP_TOKEN_FILE); prefer the environment to the command line"),
		backend:   fs.String("backend", envOr("HOLDFAST_BACKEND", "etcd"), "store: etcd or consul ($HOLDFAST_BACKEND)"),
		endpoints: fs.String("endpoints", envOr("HOLDFAST_ENDPOINTS", envOr("ETCDCTL_ENDPOINTS", "127.0.0.1:2379")), "etcd endpoints, comma-separated ($HOLDFAST_ENDPOINTS, else $ETCDCTL_ENDPOINTS)"),
		addr:      fs.String("addr", envOr("CONSUL_HTTP_ADDR", "127.0.0.1:8500"), "Consul agent HTTP address; https://host:port for HTTPS ($CONSUL_HTTP_ADDR, $CONSUL_HTTP_SSL)"),
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// session is an open session on either store, with the constructors the
// commands need.
type session struct {
	backend string
	etcd    *hfetcd.Session
	consul  *hfconsul.Session
	// unanswered: a release, or a timed-out --try attempt with the store
	// answering otherwise, was not answered in time, so the close is
	// bounded as after a loss (closeSession).
	// silent: the store did not answer within --timeout: the close is not
	// waited for at all (the store expires the session).
	silent     bool
	unanswered bool
}

// otherStoreAddress refuses the other store's address flag given on the
// command line (--addr with etcd, --endpoints with Consul), as the other
// store's other flags are: their environment variables may be set for both.
func (f *storeFlags) otherStoreAddress(ctx context.Context) error {
	switch {
	case *f.backend == "etcd" && flagGiven(ctx, "addr"):
		return usagef("--addr applies to Consul only (etcd: --endpoints)")
	case *f.backend == "consul" && flagGiven(ctx, "endpoints"):
		return usagef("--endpoints applies to etcd only (Consul: --addr)")
	}
	return nil
}

// open checks the flags and opens a session. A --ttl or --lock-delay given
// on the command line goes to the library as given, which refuses a value
// out of range (0 and negative included) before any request.
func (f *storeFlags) open(ctx context.Context) (*session, error) {
	if err := f.otherStoreAddress(ctx); err != nil {
		return nil, err
	}
	ttlGiven, lockDelayGiven := flagGiven(ctx, "ttl"), flagGiven(ctx, "lock-delay")
	switch *f.backend {
	case "etcd":
		if lockDelayGiven {
			return nil, usagef("--lock-delay applies to Consul only")
		}
		sec, err := f.secure()
		if err != nil {
			return nil, err
		}
		var opts []hfetcd.SessionOption
		for _, o := range f.observers {
			opts = append(opts, hfetcd.WithObserver(o))
		}
		if f.logger != nil {
			opts = append(opts, hfetcd.WithLogger(f.logger))
		}
		if ttlGiven {
			opts = append(opts, hfetcd.WithTTL(*f.ttl))
		}
		if sec.tls() {
			opts = append(opts, hfetcd.WithTLSFiles(sec.cacert, sec.cert, sec.key))
		}
		if sec.user != "" {
			opts = append(opts, hfetcd.WithCredentials(sec.user, sec.password.Reveal()))
		}
		eps, err := endpointList("--endpoints", *f.endpoints)
		if err != nil {
			return nil, err
		}
		var s *hfetcd.Session
		direct := func(ctx context.Context) (err error) {
			s, err = hfetcd.Dial(ctx, eps, opts...)
			return err
		}
		dial := direct
		if !f.opened {
			dial = func(ctx context.Context) error { return failFastRefused(ctx, eps, direct) }
		}
		if err := dial(ctx); err != nil {
			return nil, err
		}
		f.opened = true
		return &session{backend: "etcd", etcd: s}, nil
	case "consul":
		sec, err := f.secure()
		if err != nil {
			return nil, err
		}
		var opts []hfconsul.SessionOption
		for _, o := range f.observers {
			opts = append(opts, hfconsul.WithObserver(o))
		}
		if f.logger != nil {
			opts = append(opts, hfconsul.WithLogger(f.logger))
		}
		if ttlGiven {
			opts = append(opts, hfconsul.WithTTL(*f.ttl))
		}
		if sec.tls() {
			opts = append(opts, hfconsul.WithTLSFiles(sec.cacert, sec.cert, sec.key))
		}
		if !sec.token.Empty() {
			opts = append(opts, hfconsul.WithToken(sec.token.Reveal()))
		}
		if lockDelayGiven {
			opts = append(opts, hfconsul.WithLockDelay(*f.lockDelay))
		}
		s, err := hfconsul.Dial(ctx, *f.addr, opts...)
		if err != nil {
			return nil, err
		}
		return &session{backend: "consul", consul: s}, nil
	default:
		return nil, usagef("--backend %q: want etcd or consul", *f.backend)
	}
}

// mutex returns the lock called name on the session's store.
func (s *session) mutex(name string) (holdfast.Locker, error) {
	if s.etcd != nil {
		m, err := hfetcd.NewMutex(s.etcd, name)
		if err != nil {
			return nil, err
		}
		return holdfast.AsLocker(m), nil
	}
	m, err := hfconsul.NewMutex(s.consul, name)
	if err != nil {
		return nil, err
	}
	return holdfast.AsLocker(m), nil
}

// semaphore returns the semaphore called name with the given limit.
func (s *session) semaphore(name string, limit int) (holdfast.Locker, error) {
	if s.etcd != nil {
		m, err := hfetcd.NewSemaphore(s.etcd, name, limit)
		if err != nil {
			return nil, err
		}
		return holdfast.AsLocker(m), nil
	}
	m, err := hfconsul.NewSemaphore(s.consul, name, limit)
	if err != nil {
		return nil, err
	}
	return holdfast.AsLocker(m), nil
}

// candidate is either backend's election, with holdfast.Grant grants.
type candidate interface {
	Campaign(ctx context.Context, value []byte) (holdfast.Grant, error)
	Leader(ctx context.Context) (holdfast.Leader, error)
	Observe(ctx context.Context) <-chan holdfast.Leader
}

type anyCandidate[G holdfast.Grant] struct{ c leader.Candidate[G] }

func (a anyCandidate[G]) Campaign(ctx context.Context, value []byte) (holdfast.Grant, error) {
	g, err := a.c.Campaign(ctx, value)
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (a anyCandidate[G]) Leader(ctx context.Context) (holdfast.Leader, error) { return a.c.Leader(ctx) }

func (a anyCandidate[G]) Observe(ctx context.Context) <-chan holdfast.Leader { return a.c.Observe(ctx) }

// election returns the election called name.
func (s *session) election(name string) (candidate, error) {
	if s.etcd != nil {
		e, err := hfetcd.NewElection(s.etcd, name)
		if err != nil {
			return nil, err
		}
		return anyCandidate[*hfetcd.Grant]{e}, nil
	}
	e, err := hfconsul.NewElection(s.consul, name)
	if err != nil {
		return nil, err
	}
	return anyCandidate[*hfconsul.Grant]{e}, nil
}

// Err returns why the session ended, or nil while it lives.
func (s *session) Err() error {
	if s.etcd != nil {
		return s.etcd.Err()
	}
	return s.consul.Err()
}

// ping reads name from the store (its count only): nil if the store
// answered within ctx.
func (s *session) ping(ctx context.Context, name string) error {
	if s.etcd != nil {
		_, err := s.etcd.Client().Get(ctx, name, clientv3.WithCountOnly())
		return err
	}
	_, _, err := s.consul.Client().KV().Get(name, (&api.QueryOptions{}).WithContext(ctx))
	return err
}

// TTL is the session's TTL.
func (s *session) TTL() time.Duration {
	if s.etcd != nil {
		return s.etcd.TTL()
	}
	return s.consul.TTL()
}

// Close closes the session: the store forgets whatever it still holds.
func (s *session) Close() error {
	if s.etcd != nil {
		return s.etcd.Close()
	}
	return s.consul.Close()
}

// nativeEnv returns the environment variables the native lock commands set
// for their child, for drop-in use: etcdctl lock's ETCD_LOCK_KEY and
// ETCD_LOCK_REV (ours is the key's create revision, the fencing token), and
// consul lock's CONSUL_LOCK_HELD.
func (s *session) nativeEnv(g holdfast.Grant) []string {
	if s.etcd != nil {
		return []string{"ETCD_LOCK_KEY=" + g.Key(), "ETCD_LOCK_REV=" + g.Token().String()}
	}
	return []string{"CONSUL_LOCK_HELD=true"}
}

// describe names the store for messages (without any password a URL may
// carry).
func (f *storeFlags) describe() string {
	if *f.backend == "consul" {
		return fmt.Sprintf("consul at %s", redact(*f.addr))
	}
	eps := splitList(*f.endpoints)
	for i := range eps {
		eps[i] = redact(eps[i])
	}
	return fmt.Sprintf("etcd at %s", strings.Join(eps, ","))
}

// redact hides the password of a URL with user information.
func redact(addr string) string {
	if u, err := url.Parse(addr); err == nil && u.User != nil {
		return u.Redacted()
	}
	return addr
}

// security is the TLS and authentication settings of the store flags and
// the environment.
type security struct {
	cacert, cert, key string          // files
	fromFlags         bool            // a TLS flag was given (Consul: the environment applies otherwise)
	user              string          // etcd
	password          tlsfiles.Secret // etcd
	token             tlsfiles.Secret // Consul: --token only (the client reads the environment itself)
}

// tls reports whether holdfast itself must configure TLS: etcd with a
// file named; Consul with a TLS flag given (otherwise Consul's client
// reads its variables itself).
func (s security) tls() bool {
	return s.fromFlags || s.cacert != "" || s.cert != "" || s.key != ""
}

// secure resolves the TLS and authentication flags for the chosen store,
// falling back on the native tools' environment variables, and refuses the
// flags of the other store.
func (f *storeFlags) secure() (security, error) {
	var s security
	switch *f.backend {
	case "etcd":
		if *f.token != "" {
			return s, usagef("--token applies to Consul only (etcd: --user, --password)")
		}
		s.cacert = flagOr(*f.cacert, "ETCDCTL_CACERT")
		s.cert = flagOr(*f.cert, "ETCDCTL_CERT")
		s.key = flagOr(*f.key, "ETCDCTL_KEY")
		user := flagOr(*f.user, "ETCDCTL_USER")
		password := flagOr(*f.password, "ETCDCTL_PASSWORD")
		switch {
		case user == "" && password != "":
			return s, usagef("a password (--password or $ETCDCTL_PASSWORD) needs a user: --user or $ETCDCTL_USER")
		case user == "":
		case password != "": // as etcdctl: the user name is taken whole
			s.user, s.password = user, tlsfiles.NewSecret(password)
		default:
			name, pw, ok := strings.Cut(user, ":")
			if !ok || pw == "" {
				return s, usagef("user %q needs a password: --user USER:PASSWORD, --password or $ETCDCTL_PASSWORD", name)
			}
			s.user, s.password = name, tlsfiles.NewSecret(pw)
		}
	case "consul":
		switch {
		case *f.user != "":
			return s, usagef("--user applies to etcd only (Consul: --token)")
		case *f.password != "":
			return s, usagef("--password applies to etcd only (Consul: --token)")
		}
		s.token = tlsfiles.NewSecret(*f.token)
		if *f.cacert != "" || *f.cert != "" || *f.key != "" {
			s.fromFlags = true
			s.cacert = flagOr(*f.cacert, "CONSUL_CACERT")
			s.cert = flagOr(*f.cert, "CONSUL_CLIENT_CERT")
			s.key = flagOr(*f.key, "CONSUL_CLIENT_KEY")
		}
	}
	if (s.cert == "") != (s.key == "") {
		return s, usagef("a client certificate needs both --cert and --key")
	}
	return s, nil
}

// flagOr is v, or if it is empty the environment variable env.
func flagOr(v, env string) string {
	if v != "" {
		return v
	}
	return os.Getenv(env)
}

// probeDelay is how long a request to etcd runs before failFastRefused
// probes its endpoints: one that is answered sooner costs no probe.
const probeDelay = 100 * time.Millisecond

// failFastRefused runs fn, a first request to etcd, and ends it with a
// "connection refused" error as soon as every endpoint refuses a TCP
// connection: etcd's client retries a refused connection until the
// request's context ends (5 s by default), where Consul's fails at once.
// A request still running after probeDelay makes one connection attempt
// to each endpoint (not to unix sockets).
func failFastRefused(ctx context.Context, endpoints []string, fn func(context.Context) error) error {
	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		t := time.NewTimer(probeDelay)
		defer t.Stop()
		select {
		case <-pctx.Done():
			return
		case <-t.C:
		}
		if err := allRefused(pctx, endpoints); err != nil {
			cancel(err)
		}
	}()
	err := fn(pctx)
	refused := context.Cause(pctx)
	cancel(nil)
	<-probed
	if err != nil && errors.Is(refused, syscall.ECONNREFUSED) {
		return refused
	}
	return err
}

// allRefused tries a TCP connection to each endpoint and returns the
// error of the last one if every one was refused, else nil.
func allRefused(ctx context.Context, endpoints []string) error {
	var last error
	for _, ep := range endpoints {
		host := ep
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			if strings.HasPrefix(u.Scheme, "unix") {
				return nil
			}
			host = u.Host
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", host)
		if err == nil {
			c.Close()
			return nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		last = err
	}
	return last
}
