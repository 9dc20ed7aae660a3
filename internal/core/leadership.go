package core

import (
	"fmt"
	"sync"

	"github.com/holdfast/holdfast"
)

// Leadership remembers the latest leadership won through an Election, for
// its Resign and Proclaim. G is the backend's grant type; base is its
// bookkeeping.
type Leadership[G any] struct {
	mu   sync.Mutex
	cur  G
	base *Grant
}

// Won records g (with its bookkeeping base) as the latest leadership.
func (l *Leadership[G]) Won(g G, base *Grant) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cur, l.base = g, base
}

// Current returns the latest leadership, or an error wrapping
// holdfast.ErrNotHeld if there is none (not the leader of name) or it has
// ended.
func (l *Leadership[G]) Current(name string) (G, error) {
	l.mu.Lock()
	g, base := l.cur, l.base
	l.mu.Unlock()
	var zero G
	if base == nil {
		return zero, fmt.Errorf("%w: not the leader of %s", holdfast.ErrNotHeld, name)
	}
	if !base.Held() {
		return zero, base.NotHeld()
	}
	return g, nil
}
