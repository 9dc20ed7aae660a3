package tlsfiles

import (
	"crypto/tls"
	"fmt"
	"slices"
	"strings"

	"github.com/holdfast/holdfast"
)

// Options is what a backend's Dial-only options set: their names, for
// errors, and the TLS configuration (WithTLS) or files (WithTLSFiles).
type Options struct {
	Given []string
	TLS   *tls.Config
	Files *[3]string // CA, certificate, key
}

// Add records that the option called name was given.
func (o *Options) Add(name string) { o.Given = append(o.Given, name) }

// Has reports whether the option called name was given.
func (o *Options) Has(name string) bool { return slices.Contains(o.Given, name) }

// SetTLS records WithTLS(cfg): a copy of cfg (nil: an empty one).
func (o *Options) SetTLS(cfg *tls.Config) {
	o.Add("WithTLS")
	if cfg == nil {
		cfg = &tls.Config{}
	}
	o.TLS = cfg.Clone()
}

// SetFiles records WithTLSFiles(caFile, certFile, keyFile).
func (o *Options) SetFiles(caFile, certFile, keyFile string) {
	o.Add("WithTLSFiles")
	o.Files = &[3]string{caFile, certFile, keyFile}
}

// Check refuses WithTLS with WithTLSFiles, without reading any file.
func (o *Options) Check() error {
	if o.TLS != nil && o.Files != nil {
		return fmt.Errorf("%w: WithTLS and WithTLSFiles exclude each other", holdfast.ErrInvalidArgument)
	}
	return nil
}

// DialOnly refuses the options given to NewSession; instead says what to
// configure on the client.
func (o *Options) DialOnly(instead string) error {
	if len(o.Given) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: for Dial only; configure %s on the client given to NewSession", holdfast.ErrInvalidArgument, strings.Join(o.Given, ", "), instead)
}

// Config returns the TLS configuration asked for, reading the files, or nil;
// a bad file is an error wrapping holdfast.ErrInvalidArgument. store names
// the backend in it.
func (o *Options) Config(store string) (*tls.Config, error) {
	if o.Files == nil {
		return o.TLS, nil
	}
	cfg, err := Load(o.Files[0], o.Files[1], o.Files[2])
	if err != nil {
		return nil, fmt.Errorf("%w: holdfast/%s: WithTLSFiles: %w", holdfast.ErrInvalidArgument, store, err)
	}
	return cfg, nil
}
