package consul

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-cleanhttp"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/tlsfiles"
)

// dialConfig is what the options that apply to Dial only set: how Dial's
// own client reaches and authenticates to the agent.
type dialConfig struct {
	tlsfiles.Options
	token tlsfiles.Secret
}

// WithToken makes Dial's client send token as its ACL token, instead of
// $CONSUL_HTTP_TOKEN(_FILE). It needs session write and key write on the
// locks' prefixes, else requests fail with errors wrapping
// holdfast.ErrPermissionDenied, having written nothing. An empty token is an
// error wrapping holdfast.ErrInvalidArgument. Dial only: NewSession refuses
// it (configure your client).
func WithToken(token string) SessionOption {
	return func(c *sessionConfig) {
		c.dial.Add("WithToken")
		c.dial.token = tlsfiles.NewSecret(token)
	}
}

// WithTLS makes Dial's client talk HTTPS with a copy of cfg (RootCAs nil:
// the system's roots) instead of the environment's TLS settings; an
// "http://" address is then refused with holdfast.ErrInvalidArgument. Dial
// only, as WithToken; WithTLS and WithTLSFiles exclude each other.
func WithTLS(cfg *tls.Config) SessionOption {
	return func(c *sessionConfig) { c.dial.SetTLS(cfg) }
}

// WithTLSFiles is WithTLS with a configuration read by Dial from PEM files,
// as consul's -ca-file ("" for the system's roots), -client-cert and
// -client-key (both or neither); one missing or malformed is an error
// wrapping holdfast.ErrInvalidArgument. Dial only, as WithToken.
func WithTLSFiles(caFile, certFile, keyFile string) SessionOption {
	return func(c *sessionConfig) { c.dial.SetFiles(caFile, certFile, keyFile) }
}

// check validates the Dial-only options without reading any file.
func (d *dialConfig) check() error {
	if d.Has("WithToken") && d.token.Empty() {
		return fmt.Errorf("%w: WithToken: empty token", holdfast.ErrInvalidArgument)
	}
	return d.Check()
}

// client makes Dial's client for addr, its token and TLS from the
// environment unless the options say otherwise, on a transport of its own.
func (d *dialConfig) client(addr string) (*api.Client, *api.Config, *http.Transport, error) {
	cfg := api.DefaultConfig()
	if addr != "" {
		cfg.Address = addr
	}
	tr := cleanhttp.DefaultPooledTransport()
	tr.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = dialTimeout
	cfg.Transport = tr
	if d.Has("WithToken") {
		cfg.Token, cfg.TokenFile = d.token.Reveal(), ""
	}
	tlsCfg, err := d.Config("consul")
	switch {
	case err != nil:
		return nil, nil, nil, err
	case tlsCfg != nil && strings.HasPrefix(strings.ToLower(cfg.Address), "http://"):
		return nil, nil, nil, fmt.Errorf("%w: holdfast/consul: address %s is plain http, but TLS is configured: use https:// or host:port", holdfast.ErrInvalidArgument, cfg.Address)
	case tlsCfg != nil:
		cfg.Scheme, cfg.TLSConfig, tr.TLSClientConfig = "https", api.TLSConfig{}, tlsCfg
	}
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: holdfast/consul: client for %q: %w", holdfast.ErrInvalidArgument, addr, err)
	}
	return client, cfg, tr, nil
}

// explainTLS adds to err, the failure of Dial's first request over HTTPS
// below HTTP, what one TLS handshake with addr answers (net/http may report
// a refused client certificate as a broken pipe).
func explainTLS(err error, scheme, addr string, cfg *tls.Config) error {
	switch {
	case scheme != "https", statusCode(err) != 0,
		errors.Is(err, holdfast.ErrPermissionDenied), errors.Is(err, holdfast.ErrInvalidArgument),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		strings.Contains(err.Error(), "tls:"), strings.Contains(err.Error(), "x509:"):
		return err
	}
	if perr := tlsfiles.Probe(addr, cfg, 500*time.Millisecond); perr != nil {
		return fmt.Errorf("%w (%v)", err, perr)
	}
	return err
}
