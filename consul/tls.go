package consul

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/tlsfiles"
)

// dialConfig is what the options that apply to Dial only set: how Dial's
// own client reaches and authenticates to the agent.
type dialConfig struct {
	given    []string // the Dial-only options given, by name, for errors
	token    tlsfiles.Secret
	tokenSet bool
	tls      *tls.Config
	tlsFiles *[3]string // CA, certificate, key
}

func (d *dialConfig) add(name string) { d.given = append(d.given, name) }

// WithToken makes Dial's client send token as its ACL token, instead of
// $CONSUL_HTTP_TOKEN(_FILE). It needs session write and key write on the
// locks' prefixes, else requests fail with errors wrapping
// holdfast.ErrPermissionDenied, having written nothing. An empty token is an
// error wrapping holdfast.ErrInvalidArgument. Dial only: NewSession refuses
// it (configure your client).
func WithToken(token string) SessionOption {
	return func(c *sessionConfig) {
		c.dial.add("WithToken")
		c.dial.token, c.dial.tokenSet = tlsfiles.NewSecret(token), true
	}
}

// WithTLS makes Dial's client talk HTTPS with a copy of cfg (RootCAs nil:
// the system's roots) instead of the environment's TLS settings; an
// "http://" address is then refused with holdfast.ErrInvalidArgument. Dial
// only, as WithToken; WithTLS and WithTLSFiles exclude each other.
func WithTLS(cfg *tls.Config) SessionOption {
	return func(c *sessionConfig) {
		c.dial.add("WithTLS")
		if cfg == nil {
			cfg = &tls.Config{}
		}
		c.dial.tls = cfg.Clone()
	}
}

// WithTLSFiles is WithTLS with a configuration read by Dial from PEM files,
// as consul's -ca-file ("" for the system's roots), -client-cert and
// -client-key (both or neither); one missing or malformed is an error
// wrapping holdfast.ErrInvalidArgument. Dial only, as WithToken.
func WithTLSFiles(caFile, certFile, keyFile string) SessionOption {
	return func(c *sessionConfig) {
		c.dial.add("WithTLSFiles")
		c.dial.tlsFiles = &[3]string{caFile, certFile, keyFile}
	}
}

// check validates the Dial-only options without reading any file.
func (d *dialConfig) check() error {
	switch {
	case d.tls != nil && d.tlsFiles != nil:
		return fmt.Errorf("%w: WithTLS and WithTLSFiles exclude each other", holdfast.ErrInvalidArgument)
	case d.tokenSet && d.token.Empty():
		return fmt.Errorf("%w: WithToken: empty token", holdfast.ErrInvalidArgument)
	}
	return nil
}

// dialOnly refuses the Dial-only options given to NewSession.
func (d *dialConfig) dialOnly() error {
	if len(d.given) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: for Dial only; configure the token and TLS on the client given to NewSession (api.Config Token, TLSConfig)",
		holdfast.ErrInvalidArgument, strings.Join(d.given, ", "))
}

// apply sets the token and TLS the options ask for on cfg (from the
// environment) and on tr, its transport.
func (d *dialConfig) apply(cfg *api.Config, tr *http.Transport) error {
	if d.tokenSet {
		cfg.Token, cfg.TokenFile = d.token.Reveal(), ""
	}
	var tlsCfg *tls.Config
	switch {
	case d.tls != nil:
		tlsCfg = d.tls
	case d.tlsFiles != nil:
		var err error
		if tlsCfg, err = tlsfiles.Load(d.tlsFiles[0], d.tlsFiles[1], d.tlsFiles[2]); err != nil {
			return fmt.Errorf("%w: holdfast/consul: WithTLSFiles: %w", holdfast.ErrInvalidArgument, err)
		}
	default:
		return nil
	}
	if strings.HasPrefix(strings.ToLower(cfg.Address), "http://") {
		return fmt.Errorf("%w: holdfast/consul: address %s is plain http, but TLS is configured: use https:// or host:port", holdfast.ErrInvalidArgument, cfg.Address)
	}
	cfg.Scheme = "https"
	cfg.TLSConfig = api.TLSConfig{}
	tr.TLSClientConfig = tlsCfg
	return nil
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
