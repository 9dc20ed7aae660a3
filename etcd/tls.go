package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/tlsfiles"
)

// dialConfig is what the options that apply to Dial only set: how Dial's
// own client connects and authenticates.
type dialConfig struct {
	tlsfiles.Options
	user     string
	password tlsfiles.Secret // formats as [redacted]

	resolved *tls.Config // the TLS configuration Dial's client uses, if any
	dialed   bool        // Dial made the client: resolved is all its TLS
}

// WithTLS makes Dial connect over TLS with a copy of cfg: its RootCAs (nil
// means the system's roots) authenticate the server, and its Certificates
// (or GetClientCertificate), if any, are presented for mutual TLS. If
// cfg.ServerName is empty, each endpoint's host is checked against the
// server's certificate. Endpoints may then be given as "https://host:port" or
// "host:port"; an "http://" endpoint is refused (etcd's client would silently
// connect to it in plain text).
//
// It applies to Dial only: NewSession, whose client the caller configured,
// refuses it with an error wrapping holdfast.ErrInvalidArgument. WithTLS and
// WithTLSFiles exclude each other.
func WithTLS(cfg *tls.Config) SessionOption {
	return func(c *sessionConfig) { c.dial.SetTLS(cfg) }
}

// WithTLSFiles is WithTLS with a configuration read from PEM files, as
// etcdctl's --cacert, --cert and --key: caFile holds the CA certificate(s)
// that authenticate the server ("" for the system's roots), certFile and
// keyFile the client certificate and its private key for mutual TLS (both
// or neither). The files are read by Dial; one that is missing or malformed
// is an error wrapping holdfast.ErrInvalidArgument that names the file and
// never quotes its contents. Dial only, as WithTLS.
func WithTLSFiles(caFile, certFile, keyFile string) SessionOption {
	return func(c *sessionConfig) { c.dial.SetFiles(caFile, certFile, keyFile) }
}

// WithCredentials makes Dial's client authenticate as user with password
// (etcd's auth, as etcdctl's --user): the session and its locks then have
// the permissions of user's roles. A user whose roles do not grant
// read-write access to a lock's prefix gets errors wrapping
// holdfast.ErrPermissionDenied from Lock and TryLock, with nothing written;
// a wrong password or an unknown user makes Dial fail with one. Neither may
// be empty (else holdfast.ErrInvalidArgument). The password is never part
// of an error, and formats as "[redacted]". Without TLS it travels in plain
// text, as with etcdctl: combine it with WithTLS or WithTLSFiles. Dial
// only, as WithTLS.
func WithCredentials(user, password string) SessionOption {
	return func(c *sessionConfig) {
		c.dial.Add("WithCredentials")
		c.dial.user, c.dial.password = user, tlsfiles.NewSecret(password)
	}
}

// check validates the Dial-only options without reading any file.
func (d *dialConfig) check() error {
	switch {
	case d.Has("WithCredentials") && d.user == "":
		return fmt.Errorf("%w: WithCredentials: empty user name", holdfast.ErrInvalidArgument)
	case d.Has("WithCredentials") && d.password.Empty():
		return fmt.Errorf("%w: WithCredentials: empty password for user %q", holdfast.ErrInvalidArgument, d.user)
	}
	return d.Check()
}

// newClient creates Dial's client. With credentials, clientv3.New
// authenticates before it returns, bounded by DialTimeout; ctx is honoured
// as well (the client, if it comes later, is closed in the background).
func newClient(ctx context.Context, endpoints []string, d *dialConfig) (*clientv3.Client, error) {
	tlsCfg, err := d.Config("etcd")
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		for _, ep := range endpoints {
			if strings.HasPrefix(strings.ToLower(ep), "http://") {
				return nil, fmt.Errorf("%w: holdfast/etcd: endpoint %s is plain http, but TLS is configured: use https:// or host:port", holdfast.ErrInvalidArgument, ep)
			}
		}
	}
	d.resolved, d.dialed = tlsCfg, true
	timeout := connectTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(dl)), time.Millisecond)
	}
	cfg := clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          timeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		TLS:                  tlsCfg,
		Username:             d.user,
		Password:             d.password.Reveal(),
		Logger:               zap.NewNop(), // connection errors are returned, not logged
	}
	type result struct {
		c   *clientv3.Client
		err error
	}
	diagnose := d.diagnoseAhead(ctx, endpoints)
	done := make(chan result, 1)
	go func() {
		c, err := clientv3.New(cfg)
		done <- result{c, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		go func() {
			if r := <-done; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, fmt.Errorf("holdfast/etcd: dial %v: %w%s", endpoints, ctx.Err(), diagnose(ctx.Err()))
	}
	switch {
	case r.err == nil:
		diagnose(nil)
		return r.c, nil
	case errors.Is(r.err, context.DeadlineExceeded) || errors.Is(r.err, context.Canceled):
		// The authentication did not get through in time: say why.
		return nil, fmt.Errorf("holdfast/etcd: dial %v: %w%s", endpoints, r.err, diagnose(r.err))
	}
	diagnose(nil)
	return nil, fmt.Errorf("holdfast/etcd: dial %v: %w", endpoints, storeErr(r.err))
}

// diagnoseTimeout bounds diagnose: its probes of the endpoints run at once,
// each bounded by it, so that Dial returns at most this long after its
// context ends.
const diagnoseTimeout = 100 * time.Millisecond

// diagnose says why the endpoints could not be used, from one quick
// connection (and TLS handshake, if TLS is configured or the server speaks
// it) to each endpoint, all at once. It returns "" if an endpoint accepts
// all that, or if err, the reason to diagnose, is not a deadline.
func (d *dialConfig) diagnose(endpoints []string, err error) string {
	if !errors.Is(err, context.DeadlineExceeded) {
		return ""
	}
	errs := make([]error, len(endpoints))
	var wg sync.WaitGroup
	for i, ep := range endpoints {
		host, tlsCfg := ep, d.resolved
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			host = u.Host
			if tlsCfg == nil && u.Scheme == "https" {
				tlsCfg = &tls.Config{} // etcd's client uses the system's roots
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.probe(host, tlsCfg)
		}()
	}
	wg.Wait()
	var msgs []string
	for _, err := range errs {
		if err == nil {
			return ""
		}
		msgs = append(msgs, err.Error())
	}
	return "; last connection error: " + strings.Join(msgs, "; ")
}

// diagnoseAhead starts diagnose diagnoseTimeout before ctx's deadline, so
// that a caller whose request fails with that deadline has the reason at
// once instead of diagnoseTimeout later. The returned function gives
// diagnose's answer for err (its probes are not run, or not waited for,
// when err is not a deadline).
func (d *dialConfig) diagnoseAhead(ctx context.Context, endpoints []string) func(err error) string {
	dl, ok := ctx.Deadline()
	if !ok {
		return func(err error) string { return d.diagnose(endpoints, err) }
	}
	ch := make(chan string, 1)
	t := time.AfterFunc(time.Until(dl)-diagnoseTimeout, func() { ch <- d.diagnose(endpoints, context.DeadlineExceeded) })
	return func(err error) string {
		switch {
		case !errors.Is(err, context.DeadlineExceeded):
			t.Stop()
			return ""
		case t.Stop(): // the deadline came early (a parent's): probe now
			return d.diagnose(endpoints, err)
		}
		return <-ch
	}
}

func (d *dialConfig) probe(host string, tlsCfg *tls.Config) error {
	err := tlsfiles.Probe(host, tlsCfg, diagnoseTimeout)
	if errors.Is(err, tlsfiles.ErrServesTLS) {
		if !d.dialed {
			return nil // a caller's client, whose TLS settings are unknown here
		}
		return fmt.Errorf("%w (WithTLS, WithTLSFiles)", err)
	}
	return err
}
