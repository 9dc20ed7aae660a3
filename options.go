package holdfast

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// LockOption configures a lock, a semaphore or an election. Every backend
// accepts the same options.
type LockOption func(*LockConfig)

// LockConfig is the result of applying LockOptions. Backends read it; users
// set it through the With... functions.
type LockConfig struct {
	// Reentrant lets the owner of a grant (the Locker value that took it)
	// lock again without blocking: the same grant is returned, its token is
	// unchanged, and it is released by the Unlock that matches the first
	// Lock. Default false: a second Lock through the same Locker waits like
	// any other contender.
	Reentrant bool
}

// WithReentrant makes a lock reentrant: see LockConfig.Reentrant.
func WithReentrant() LockOption { return func(c *LockConfig) { c.Reentrant = true } }

// NewLockConfig applies opts to the defaults.
func NewLockConfig(opts ...LockOption) LockConfig {
	var c LockConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// MaxNameLen is the longest lock name accepted, in bytes.
const MaxNameLen = 512

// ValidateName checks a lock name against the rules common to every backend:
// not empty, at most MaxNameLen bytes of valid UTF-8, no control characters or
// white space, and no empty path segment ("a//b") or trailing "/". Backends add
// their own rules. The error wraps ErrInvalidName.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidName, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidName, name)
	case strings.HasSuffix(name, "/"):
		return fmt.Errorf("%w: %q ends with /", ErrInvalidName, name)
	case strings.Contains(name, "//"):
		return fmt.Errorf("%w: %q has an empty path segment", ErrInvalidName, name)
	}
	for _, r := range name {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return fmt.Errorf("%w: %q contains %U", ErrInvalidName, name, r)
		}
	}
	return nil
}
