package core

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
)

func TestMultiNames(t *testing.T) {
	got, err := MultiNames([]string{"b", "a/x", "b", "a"})
	if !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("a and a/x together: %v, %v; want ErrInvalidArgument", got, err)
	}
	got, err = MultiNames([]string{"c", "a", "b", "a", "ab"})
	if err != nil || !slices.Equal(got, []string{"a", "ab", "b", "c"}) {
		t.Errorf("MultiNames = %v, %v; want sorted, deduplicated [a ab b c]", got, err)
	}
	for _, bad := range [][]string{nil, {}, {"a", "/b"}, {"a", ""}} {
		if _, err := MultiNames(bad); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("MultiNames(%q): %v, want ErrInvalidArgument", bad, err)
		}
	}
}

// fakePart is a grant for LockAll's tests.
type fakePart struct {
	name   string
	ctx    context.Context
	cancel context.CancelCauseFunc
	log    *partLog
}

type partLog struct {
	mu       sync.Mutex
	unlocked []string
}

func (l *partLog) sorted() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(slices.Values(l.unlocked))
}

func newPart(name string, log *partLog) *fakePart {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &fakePart{name: name, ctx: ctx, cancel: cancel, log: log}
}

func (p *fakePart) Key() string              { return p.name + "/k" }
func (p *fakePart) Token() holdfast.Token    { return 1 }
func (p *fakePart) Context() context.Context { return p.ctx }
func (p *fakePart) Deadline() time.Time      { return time.Time{} }
func (p *fakePart) Unlock(context.Context) error {
	p.log.mu.Lock()
	p.log.unlocked = append(p.log.unlocked, p.name)
	p.log.mu.Unlock()
	p.cancel(holdfast.ErrReleased)
	return nil
}

// TestLockAll: a part that fails releases the parts taken before it; a held
// set ends with its first lost part (cause naming it, wrapping ErrLost),
// seen synchronously by its context's Err; Unlock releases every part once,
// and a second Unlock is ErrNotHeld.
func TestLockAll(t *testing.T) {
	names := []string{"a", "b", "c"}
	ctx := context.Background()
	log := &partLog{}
	boom := errors.New("boom")
	_, err := LockAll(ctx, names, func(_ context.Context, i int) (*fakePart, error) {
		if i == 2 {
			return nil, boom
		}
		return newPart(names[i], log), nil
	})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "lock c (part 3 of 3)") {
		t.Errorf("LockAll with a failing part: %v, want boom naming c", err)
	}
	if got := log.sorted(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("unlocked after the failure: %v, want [a b]", got)
	}

	log = &partLog{}
	parts := map[string]*fakePart{}
	m, err := LockAll(ctx, names, func(_ context.Context, i int) (*fakePart, error) {
		p := newPart(names[i], log)
		parts[names[i]] = p
		return p, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := m.Part("b"); !ok || p != parts["b"] {
		t.Errorf("Part(b) = %v, %v", p, ok)
	}
	if _, ok := m.Part("z"); ok {
		t.Error("Part(z) found")
	}
	if m.Key("b") != "b/k" || m.Token("b") != 1 || m.Key("z") != "" || m.Token("z") != 0 {
		t.Errorf("Key, Token of b = %q, %d; of z = %q, %d", m.Key("b"), m.Token("b"), m.Key("z"), m.Token("z"))
	}
	if !m.Held() {
		t.Fatal("multi-grant not held after LockAll")
	}
	parts["b"].cancel(holdfast.ErrLost)
	if m.Context().Err() == nil {
		t.Fatal("multi-grant context live after a part was lost")
	}
	if cause := context.Cause(m.Context()); !errors.Is(cause, holdfast.ErrLost) || !strings.Contains(cause.Error(), "b") {
		t.Errorf("cause %v, want ErrLost naming b", cause)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Errorf("Unlock: %v", err)
	}
	if got := log.sorted(); !slices.Equal(got, names) {
		t.Errorf("unlocked %v, want every part once", got)
	}

	log = &partLog{}
	m, err = LockAll(ctx, names, func(_ context.Context, i int) (*fakePart, error) { return newPart(names[i], log), nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Errorf("Unlock: %v", err)
	}
	if !errors.Is(context.Cause(m.Context()), holdfast.ErrReleased) {
		t.Errorf("cause after Unlock: %v, want ErrReleased", context.Cause(m.Context()))
	}
	if err := m.Unlock(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("second Unlock: %v, want ErrNotHeld", err)
	}
}
