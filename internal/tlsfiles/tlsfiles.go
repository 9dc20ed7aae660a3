// Package tlsfiles builds client TLS configurations from PEM files, for the
// backends' WithTLSFiles options and the command-line tool. Its errors name
// the files and say what is wrong with them, never their contents.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
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

// Secret is a string that formats as "[redacted]" with every verb of the
// fmt package, so that a password or token kept in a configuration struct
// cannot end up in an error, a log line or a panic by accident.
type Secret string

// String returns "[redacted]" (or "" for an empty secret).
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}

// GoString is String, for %#v.
func (s Secret) GoString() string { return s.String() }

// Format makes every verb (%s, %v, %q, %x, %d...) print String.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.String())) }

// Reveal returns the secret itself, for the client that sends it.
func (s Secret) Reveal() string { return string(s) }
