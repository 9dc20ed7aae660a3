package core

import "sync"

// Reentry remembers the last grant of a lock value, so that a reentrant lock
// can hand it out again. G is the backend's grant type; base is its
// bookkeeping.
type Reentry[G any] struct {
	// Enabled is set from holdfast.WithReentrant. When false, Enter never
	// succeeds and Remember keeps nothing.
	Enabled bool

	mu   sync.Mutex
	last G
	base *Grant
}

// Enter adds a hold to the last grant and returns it, if reentrancy is
// enabled and that grant is still held.
func (r *Reentry[G]) Enter() (g G, ok bool) {
	if !r.Enabled {
		return g, false
	}
	r.mu.Lock()
	g, base := r.last, r.base
	r.mu.Unlock()
	if base == nil || !base.reenter() {
		var zero G
		return zero, false
	}
	return g, true
}

// Remember records g (with its bookkeeping base) as the last grant.
func (r *Reentry[G]) Remember(g G, base *Grant) {
	if !r.Enabled {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last, r.base = g, base
}
