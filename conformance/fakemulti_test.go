package conformance_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/conformance"
	"github.com/holdfast/holdfast/internal/core"
)

// Bugs of the fake's multi-name lock.
const (
	bugMultiNoOrder      = "multi-no-order"      // names taken in the caller's order: two callers deadlock
	bugMultiKeepsParts   = "multi-keeps-parts"   // a failed acquisition keeps the parts it took
	bugMultiIgnoresParts = "multi-ignores-parts" // the context ignores a lost part
)

// newMultiLocker returns a function that makes multi-name locks of the fake
// store; each name is a fake lock on a session of its own (all closed with
// t), taken in canonical order with core.LockAll.
func (st *fakeStore) newMultiLocker(t *testing.T) (func(names ...string) (conformance.MultiLocker, error), conformance.Faults) {
	t.Helper()
	_, f := st.newLocker(t, "fake/multi", kindLock, 0, nil) // the faults of a session, for the suite
	return func(names ...string) (conformance.MultiLocker, error) {
		sorted, err := core.MultiNames(names)
		if err != nil {
			return nil, err
		}
		if st.bug == bugMultiNoOrder {
			sorted = slices.Clone(names)
		}
		ls := make([]*fakeLocker, len(sorted))
		for i, n := range sorted {
			ls[i], _ = st.newLocker(t, n, kindLock, 0, nil)
		}
		return &fakeMulti{st: st, names: sorted, ls: ls}, nil
	}, f
}

type fakeMulti struct {
	st    *fakeStore
	names []string
	ls    []*fakeLocker
}

func (m *fakeMulti) Lock(ctx context.Context) (conformance.MultiGrant, error) {
	lock := func(ctx context.Context, i int) (holdfast.Grant, error) { return m.ls[i].Lock(ctx) }
	if m.st.bug == bugMultiKeepsParts {
		held := make([]holdfast.Grant, len(m.ls))
		for i, l := range m.ls {
			var err error
			if held[i], err = l.Lock(ctx); err != nil {
				return nil, fmt.Errorf("fake: lock %s: %w", m.names[i], err) // the parts before stay held
			}
		}
		lock = func(_ context.Context, i int) (holdfast.Grant, error) { return held[i], nil }
	}
	multi, err := core.LockAll(ctx, m.names, lock)
	if err != nil {
		return nil, err
	}
	return &fakeMultiGrant{m: multi, firstOnly: m.st.bug == bugMultiIgnoresParts}, nil
}

type fakeMultiGrant struct {
	m         *core.Multi[holdfast.Grant]
	firstOnly bool // the context follows only the first part
}

func (g *fakeMultiGrant) Names() []string { return g.m.Names() }

func (g *fakeMultiGrant) Key(name string) string {
	if p, ok := g.m.Part(name); ok {
		return p.Key()
	}
	return ""
}

func (g *fakeMultiGrant) Token(name string) holdfast.Token {
	if p, ok := g.m.Part(name); ok {
		return p.Token()
	}
	return 0
}

func (g *fakeMultiGrant) Context() context.Context {
	if g.firstOnly {
		return g.m.Parts()[0].Context()
	}
	return g.m.Context()
}

func (g *fakeMultiGrant) Unlock(ctx context.Context) error { return g.m.Unlock(ctx) }
