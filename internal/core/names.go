package core

import (
	"context"
	"fmt"
	"sync"

	"github.com/holdfast/holdfast"
)

// Names gives in-process exclusion per lock name within one session. A
// session's store key for a name is fixed (etcd: name/<lease>), so two
// acquisitions of one name through one session must not run at once: the
// second waits here, in first-come order, before it talks to the store.
type Names struct {
	mu sync.Mutex
	m  map[string]*slot
}

type slot struct {
	ch   chan struct{} // holds one token while the name is taken
	refs int           // holders plus waiters; the slot is dropped at zero
}

func (n *Names) get(name string) *slot {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = make(map[string]*slot)
	}
	s := n.m[name]
	if s == nil {
		s = &slot{ch: make(chan struct{}, 1)}
		n.m[name] = s
	}
	s.refs++
	return s
}

func (n *Names) put(name string, s *slot) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s.refs--; s.refs == 0 {
		delete(n.m, name)
	}
}

// Acquire waits until name is free in this session or ctx is done. The
// returned function frees the name; it is safe to call more than once.
func (n *Names) Acquire(ctx context.Context, name string) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := n.get(name)
	select {
	case s.ch <- struct{}{}:
		return n.releaser(name, s), nil
	case <-ctx.Done():
		n.put(name, s)
		return nil, ctx.Err()
	}
}

// Slot takes name for an acquisition: if try, only if it is free (else an
// error wrapping holdfast.ErrLocked), else waiting until it is or ctx ends.
func (n *Names) Slot(ctx context.Context, name string, try bool) (release func(), err error) {
	if !try {
		return n.Acquire(ctx, name)
	}
	if release, ok := n.TryAcquire(name); ok {
		return release, nil
	}
	return nil, fmt.Errorf("%w: %s is being taken through this session", holdfast.ErrLocked, name)
}

// TryAcquire takes name if it is free in this session.
func (n *Names) TryAcquire(name string) (release func(), ok bool) {
	s := n.get(name)
	select {
	case s.ch <- struct{}{}:
		return n.releaser(name, s), true
	default:
		n.put(name, s)
		return nil, false
	}
}

func (n *Names) releaser(name string, s *slot) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			<-s.ch
			n.put(name, s)
		})
	}
}
