package holdfast_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/options"
)

func TestValidateName(t *testing.T) {
	good := []string{
		"a",
		"locks",
		"locks/orders",
		"locks/orders/42",
		"locks/v1.2",
		"locks/a..b",
		"a.b-c_d:e@f",
		"ロック/注文",
		"\u00e9",
		strings.Repeat("a", holdfast.MaxNameLen),
		strings.Repeat("é", holdfast.MaxNameLen/2), // 512 bytes, 256 runes
		strings.Repeat("a/", holdfast.MaxNameLen/2-1) + "ab",
	}
	bad := []struct{ why, name string }{
		{"empty", ""},
		{"513 bytes", strings.Repeat("a", holdfast.MaxNameLen+1)},
		{"513 bytes, 257 runes", strings.Repeat("é", holdfast.MaxNameLen/2) + "a"},
		{"invalid UTF-8", "locks/\xff"},
		{"truncated UTF-8", "locks/\xc3"},
		{"UTF-8 surrogate", "locks/\xed\xa0\x80"},
		{"NUL", "locks/\x00a"},
		{"newline", "locks/a\n"},
		{"tab", "locks\ta"},
		{"carriage return", "a\rb"},
		{"DEL", "a\x7fb"},
		{"C1 control", "a\u0085b"},
		{"space", "locks/my lock"},
		{"leading space", " locks"},
		{"trailing space", "locks "},
		{"no-break space", "a\u00a0b"},
		{"ideographic space", "a\u3000b"},
		{"line separator", "a\u2028b"},
		{"trailing slash", "locks/"},
		{"only a slash", "/"},
		{"empty segment", "locks//a"},
		{"empty segment at the start", "//locks"},
		{"triple slash", "a///b"},
		{"leading slash", "/locks/orders"},
		{"dot segment", "locks/./a"},
		{"dot-dot segment", "locks/../a"},
		{"reserved .lock segment", "locks/.lock"},
		{"reserved .queue segment", "a/.queue/b"},
		{"hidden first segment", ".locks"},
	}
	for _, name := range good {
		if err := holdfast.ValidateName(name); err != nil {
			t.Errorf("ValidateName(%q) = %v, want nil", name, err)
		}
	}
	for _, c := range bad {
		err := holdfast.ValidateName(c.name)
		if !errors.Is(err, holdfast.ErrInvalidName) {
			t.Errorf("ValidateName(%q) (%s) = %v, want ErrInvalidName", c.name, c.why, err)
			continue
		}
		if !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("ValidateName(%q) (%s) = %v, does not wrap ErrInvalidArgument", c.name, c.why, err)
		}
	}
}

func TestLockOptions(t *testing.T) {
	apply := func(opts ...holdfast.LockOption) options.Lock { return options.ApplyLock(opts) }
	if c := apply(); c != (options.Lock{}) {
		t.Errorf("no options = %+v, want the zero config", c)
	}
	if c := apply(holdfast.WithReentrant()); !c.Reentrant {
		t.Error("WithReentrant(): Reentrant = false")
	}
	if c := apply(nil); c.Reentrant {
		t.Error("nil option: Reentrant = true")
	}
	if c := apply(nil, holdfast.WithReentrant(), nil); !c.Reentrant {
		t.Error("nil, WithReentrant(), nil: Reentrant = false")
	}
	// Options apply in order; a custom option sees what came before.
	var seen bool
	record := func(c *options.Lock) { seen = c.Reentrant }
	apply(holdfast.WithReentrant(), record)
	if !seen {
		t.Error("an option did not see the effect of the option before it")
	}
}

func TestErrorRelationships(t *testing.T) {
	all := map[string]error{
		"ErrInvalidArgument":  holdfast.ErrInvalidArgument,
		"ErrInvalidName":      holdfast.ErrInvalidName,
		"ErrInvalidTTL":       holdfast.ErrInvalidTTL,
		"ErrLocked":           holdfast.ErrLocked,
		"ErrNotHeld":          holdfast.ErrNotHeld,
		"ErrLost":             holdfast.ErrLost,
		"ErrSessionLost":      holdfast.ErrSessionLost,
		"ErrSessionClosed":    holdfast.ErrSessionClosed,
		"ErrReleased":         holdfast.ErrReleased,
		"ErrConflict":         holdfast.ErrConflict,
		"ErrPermissionDenied": holdfast.ErrPermissionDenied,
		"ErrStaleToken":       holdfast.ErrStaleToken,
	}
	// wraps[a] lists every sentinel a matches besides itself.
	wraps := map[string][]string{
		"ErrInvalidName": {"ErrInvalidArgument"},
		"ErrInvalidTTL":  {"ErrInvalidArgument"},
		"ErrSessionLost": {"ErrLost"},
	}
	for an, a := range all {
		for bn, b := range all {
			want := an == bn
			for _, w := range wraps[an] {
				want = want || w == bn
			}
			if got := errors.Is(a, b); got != want {
				t.Errorf("errors.Is(%s, %s) = %v, want %v", an, bn, got, want)
			}
		}
		if a == nil || !strings.HasPrefix(a.Error(), "holdfast: ") {
			t.Errorf("%s = %v, want a message starting with \"holdfast: \"", an, a)
		}
		for _, ctxErr := range []error{context.Canceled, context.DeadlineExceeded} {
			if errors.Is(a, ctxErr) {
				t.Errorf("%s matches %v", an, ctxErr)
			}
		}
	}
	msgs := map[string]string{}
	for n, e := range all {
		if other, dup := msgs[e.Error()]; dup {
			t.Errorf("%s and %s have the same message %q", n, other, e.Error())
		}
		msgs[e.Error()] = n
	}
	// Wrapped with detail, as backends do, the relationships hold.
	err := withDetail(holdfast.ErrSessionLost)
	if !errors.Is(err, holdfast.ErrLost) || !errors.Is(err, holdfast.ErrSessionLost) {
		t.Errorf("%v: detail wrapping broke errors.Is", err)
	}
}

type detailErr struct{ err error }

func (d detailErr) Error() string { return "lease 694d7a3b: " + d.err.Error() }
func (d detailErr) Unwrap() error { return d.err }

func withDetail(err error) error { return detailErr{err} }
