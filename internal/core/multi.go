package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/mutant"
)

// MultiNames validates the names of a multi-name lock and returns them in
// the canonical order every acquisition follows: sorted, without
// duplicates. A name that is a prefix of another at a "/" ("a" and "a/b")
// cannot be locked beside it (each store refuses it with ErrConflict), so
// such a set is refused here, wrapping holdfast.ErrInvalidArgument.
func MultiNames(names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: no names to lock", holdfast.ErrInvalidArgument)
	}
	for _, n := range names {
		if err := holdfast.ValidateName(n); err != nil {
			return nil, err
		}
	}
	sorted := slices.Compact(slices.Sorted(slices.Values(names)))
	if mutant.On("core/multi-order") {
		// The caller's order: two callers can deadlock.
		sorted = slices.Clone(names)
	}
	for i := 1; i < len(sorted); i++ {
		// Sorted, a name is followed by the names it is a prefix of.
		if strings.HasPrefix(sorted[i], sorted[i-1]+"/") || sorted[i] == sorted[i-1] {
			return nil, fmt.Errorf("%w: %q and %q cannot be locked together (one is under the other)", holdfast.ErrInvalidArgument, sorted[i-1], sorted[i])
		}
	}
	return sorted, nil
}

// Multi is a grant of several names: one part per name, in canonical order.
// Its context ends when any part's does.
type Multi[G holdfast.Grant] struct {
	names  []string
	parts  []G
	ctx    *multiContext
	cancel context.CancelCauseFunc
	stops  []func() bool
}

// LockAll takes lock(ctx, i) for each of names (canonical order, see
// MultiNames) one after the other, and returns them as one Multi. If one
// fails, the parts already taken are released (Unlock with a context that
// has ended if ctx has, so that their releases go on in the background)
// and the error is returned, naming the part.
func LockAll[G holdfast.Grant](ctx context.Context, names []string, lock func(ctx context.Context, i int) (G, error)) (*Multi[G], error) {
	parts := make([]G, 0, len(names))
	for i, n := range names {
		g, err := lock(ctx, i)
		if err != nil {
			releaseAll(ctx, parts)
			return nil, fmt.Errorf("holdfast: lock %s (part %d of %d): %w", n, i+1, len(names), err)
		}
		parts = append(parts, g)
	}
	m := &Multi[G]{names: names, parts: parts}
	inner, cancel := context.WithCancelCause(context.Background())
	m.ctx, m.cancel = &multiContext{Context: inner, check: m.check}, cancel
	for i, g := range parts {
		m.stops = append(m.stops, context.AfterFunc(g.Context(), func() { m.end(i) }))
	}
	return m, nil
}

// releaseAll unlocks parts, each within ctx or, if ctx has ended, at once
// (the releases go on in the session's background).
func releaseAll[G holdfast.Grant](ctx context.Context, parts []G) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), AttemptTimeout)
	if ctx.Err() != nil {
		cancel() // do not wait: the sessions finish the releases
	}
	defer cancel()
	var wg sync.WaitGroup
	for _, g := range parts {
		wg.Go(func() { _ = g.Unlock(uctx) })
	}
	wg.Wait()
}

// end ends the multi-grant because part i ended.
func (m *Multi[G]) end(i int) {
	cause := context.Cause(m.parts[i].Context())
	if errors.Is(cause, holdfast.ErrReleased) && m.ctx.Context.Err() == nil {
		// A part released on its own (not through Multi.Unlock): the set
		// is no longer held.
		cause = fmt.Errorf("%w: %s was released on its own", holdfast.ErrLost, m.names[i])
	} else if cause != nil && !errors.Is(cause, holdfast.ErrReleased) {
		cause = fmt.Errorf("%s: %w", m.names[i], cause)
	}
	m.cancel(cause)
}

// check ends the multi-grant now if a part has ended (a part's Err checks
// its session's deadline synchronously).
func (m *Multi[G]) check() {
	if m.ctx.Context.Err() != nil {
		return
	}
	for i, g := range m.parts {
		if g.Context().Err() != nil {
			m.end(i)
			return
		}
	}
}

// multiContext is a multi-grant's context: Err and Done check every part.
type multiContext struct {
	context.Context
	check func()
}

func (c *multiContext) Err() error {
	c.check()
	return c.Context.Err()
}

func (c *multiContext) Done() <-chan struct{} {
	c.check()
	return c.Context.Done()
}

// Names returns the names, in canonical order.
func (m *Multi[G]) Names() []string { return slices.Clone(m.names) }

// Parts returns the grants, one per name, in the order of Names.
func (m *Multi[G]) Parts() []G { return slices.Clone(m.parts) }

// Part returns the grant of name, and whether name is one of the set.
func (m *Multi[G]) Part(name string) (G, bool) {
	if i, ok := slices.BinarySearch(m.names, name); ok {
		return m.parts[i], true
	}
	var zero G
	return zero, false
}

// Token returns the token of name's grant (0: not one of the set).
func (m *Multi[G]) Token(name string) holdfast.Token {
	if p, ok := m.Part(name); ok {
		return p.Token()
	}
	return 0
}

// Key returns the key of name's grant ("": not one of the set).
func (m *Multi[G]) Key(name string) string {
	if p, ok := m.Part(name); ok {
		return p.Key()
	}
	return ""
}

// Context is cancelled when any part ends: with ErrReleased after Unlock,
// else with the cause of the first part that ended, naming it.
func (m *Multi[G]) Context() context.Context { return m.ctx }

// Deadline is the earliest of the parts' deadlines.
func (m *Multi[G]) Deadline() time.Time {
	var d time.Time
	for i, g := range m.parts {
		if pd := g.Deadline(); i == 0 || pd.Before(d) {
			d = pd
		}
	}
	return d
}

// Held reports whether every part is still held.
func (m *Multi[G]) Held() bool { return m.ctx.Err() == nil }

// NotHeld is the error of an operation on a multi-grant that is no longer
// held: it wraps holdfast.ErrNotHeld and the cause.
func (m *Multi[G]) NotHeld() error {
	return fmt.Errorf("%w: %s: %w", holdfast.ErrNotHeld, strings.Join(m.names, ", "), context.Cause(m.ctx))
}

// Lose ends the multi-grant with cause (a guarded write found a part gone).
func (m *Multi[G]) Lose(cause error) { m.cancel(cause) }

// Unlock releases every part at once (each part's Unlock, concurrently,
// within ctx) and returns their errors joined; the context ends with
// ErrReleased first. A second Unlock returns an error wrapping ErrNotHeld.
func (m *Multi[G]) Unlock(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if m.ctx.Context.Err() != nil && errors.Is(context.Cause(m.ctx), holdfast.ErrReleased) {
		return m.NotHeld()
	}
	for _, stop := range m.stops {
		stop()
	}
	m.cancel(holdfast.ErrReleased)
	errs := make([]error, len(m.parts))
	var wg sync.WaitGroup
	for i, g := range m.parts {
		wg.Go(func() {
			if err := g.Unlock(ctx); err != nil {
				errs[i] = fmt.Errorf("%s: %w", m.names[i], err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
