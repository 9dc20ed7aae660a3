// Package tlsfiles builds client TLS configurations from PEM files, for the
// backends' WithTLSFiles options and the command-line tool. Its errors name
// the files and say what is wrong with them, never their contents.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// Load returns a client TLS configuration that trusts the CA certificates in
// caFile ("" means the system's roots) and, if certFile and keyFile are set
// (both or neither), presents that client certificate. TLS 1.2 at least.
func Load(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case certFile == "" && keyFile == "":
	case certFile == "" || keyFile == "":
		return nil, errors.New("a client certificate needs both its certificate file and its key file")
	default:
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s and key %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// Secret holds a password or token so that it cannot end up in an error, a
// log line or a panic by accident: it formats as "[redacted]" with every
// verb of the fmt package, and as a bare pointer where fmt cannot call its
// methods (an unexported field of a struct being printed). The zero Secret
// is empty.
type Secret struct{ p *string }

// NewSecret returns a Secret holding s.
func NewSecret(s string) Secret {
	if s == "" {
		return Secret{}
	}
	return Secret{&s}
}

// Empty reports whether the secret is "".
func (s Secret) Empty() bool { return s.p == nil }

// String returns "[redacted]" (or "" for an empty secret).
func (s Secret) String() string {
	if s.Empty() {
		return ""
	}
	return "[redacted]"
}

// GoString is String, for %#v.
func (s Secret) GoString() string { return s.String() }

// Format makes every verb (%s, %v, %q, %x, %d...) print String.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.String())) }

// Reveal returns the secret itself, for the client that sends it.
func (s Secret) Reveal() string {
	if s.p == nil {
		return ""
	}
	return *s.p
}

// ErrServesTLS is Probe's answer when the server speaks TLS and the probe
// was given no TLS configuration.
var ErrServesTLS = errors.New("the server speaks TLS, but no TLS was configured")

// Probe connects to host ("host:port") within timeout and, with cfg, does a
// TLS handshake and waits (within the same timeout) for the server's verdict
// on our certificate, which TLS 1.3 delivers after the handshake as an
// alert; without cfg, it reports a server that speaks TLS. It returns nil
// if the server accepts all that, else an error that says what failed (the
// connection, or the handshake: "certificate signed by unknown authority",
// "certificate required"...). It sends no application data.
func Probe(host string, cfg *tls.Config, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", host, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if cfg == nil {
		// The server's certificate is not checked: nothing is sent after.
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a probe that sends no data
		if tc.Handshake() == nil {
			return fmt.Errorf("%s: %w", host, ErrServesTLS)
		}
		return nil
	}
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		if h, _, err := net.SplitHostPort(host); err == nil {
			cfg.ServerName = h
		}
	}
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake with %s: %w", host, err)
	}
	if _, err := tc.Read(make([]byte, 1)); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil // the server waits for us: it accepted the handshake
		}
		return fmt.Errorf("TLS handshake with %s: %w", host, err)
	}
	return nil
}
