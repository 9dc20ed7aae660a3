package holdfast

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/holdfast/holdfast/internal/options"
)

// LockOption configures a lock. Every backend accepts the same options; see
// WithReentrant.
type LockOption func(*options.Lock)

// WithReentrant makes a lock reentrant: the owner of a grant (the lock value,
// such as an *etcd.Mutex, that took it) may lock again while it holds the
// grant without blocking. The same grant is returned, its token is
// unchanged, and it is released by the Unlock that matches the first Lock.
// Without it (the default), a second Lock through the same lock value waits
// like any other contender. Mutexes and semaphores accept it on every
// backend; read-write locks are never reentrant, and their constructors
// refuse it with an error wrapping ErrInvalidArgument (conformance property
// RWReentrancy).
func WithReentrant() LockOption { return func(c *options.Lock) { c.Reentrant = true } }

// MaxNameLen is the longest lock name accepted, in bytes.
const MaxNameLen = 512

// ValidateName checks a lock name against the rule that every backend
// applies, so that a name means the same lock on every store:
//
//   - 1 to MaxNameLen bytes of valid UTF-8, each character a letter, a
//     mark, a number, punctuation or a symbol (Unicode categories L, M, N,
//     P, S): no white space, no control or format character (U+200B), no
//     private-use or unassigned code point, which Consul refuses;
//   - a path of segments separated by "/": no leading or trailing "/", no
//     empty segment ("a//b");
//   - no segment starting with "." (such segments name holdfast's own keys,
//     as in "<name>/.lock" on Consul; "." and ".." are refused too).
//
// Names are hierarchical, and a name must not be used as a lock while a
// longer name under it ("jobs" and "jobs/nightly") is in use: the native
// etcd layout keeps a lock's keys under "<name>/", so the shorter name would
// see the longer name's keys as its own queue. A backend that finds keys of
// a longer name under the one it locks fails with an error wrapping
// ErrConflict; the longer name is not affected.
//
// The error wraps ErrInvalidName.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidName, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidName, name)
	case strings.HasPrefix(name, "/"):
		return fmt.Errorf("%w: %q starts with /", ErrInvalidName, name)
	case strings.HasSuffix(name, "/"):
		return fmt.Errorf("%w: %q ends with /", ErrInvalidName, name)
	case strings.Contains(name, "//"):
		return fmt.Errorf("%w: %q has an empty path segment", ErrInvalidName, name)
	}
	for _, r := range name {
		if !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S) {
			return fmt.Errorf("%w: %q contains %U, not a letter, mark, number, punctuation or symbol", ErrInvalidName, name, r)
		}
	}
	for seg := range strings.SplitSeq(name, "/") {
		if strings.HasPrefix(seg, ".") {
			return fmt.Errorf("%w: %q has the segment %q: segments starting with . are reserved for holdfast's keys", ErrInvalidName, name, seg)
		}
	}
	return nil
}
