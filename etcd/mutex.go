package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

// watchDelay is how long a grant is held before the session watches its key:
// short critical sections do not pay for creating and cancelling a watch.
const watchDelay = 20 * time.Millisecond

// Mutex is a distributed, FIFO, fenced lock on etcd. Its keys are those of
// concurrency.Mutex: "<name>/<lease ID in hex>", attached to the session's
// lease; the holder is the key with the lowest create revision. Their value
// is "holdfast lock" (concurrency.Mutex writes an empty one; neither reads
// it), which tells Inspect who wrote them.
//
// A lock's name may not be a prefix of another's at a "/": while the lock
// "a/b" has keys (a holder or waiters), Lock and TryLock of "a" fail with an
// error wrapping holdfast.ErrConflict, as they do on Consul; "a/b" itself is
// unaffected.
//
// A Mutex belongs to one Session. Lock and TryLock may be called from many
// goroutines: through one Session, acquisitions of the same name take turns
// in-process, since they share one key.
type Mutex struct {
	name    string
	q       queue
	reentry core.Reentry[*Grant]
}

var _ holdfast.GrantLocker[*Grant] = (*Mutex)(nil)

// NewMutex returns the lock called name, taken through session s. The name
// follows holdfast.ValidateName; the lock's keys are under "<name>/".
func NewMutex(s *Session, name string, opts ...holdfast.LockOption) (*Mutex, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, err
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	cfg := options.ApplyLock(opts)
	q := newQueue(s, name+"/")
	q.value = mutexValue
	return &Mutex{
		name:    name,
		q:       q,
		reentry: core.Reentry[*Grant]{Enabled: cfg.Reentrant},
	}, nil
}

// Name returns the lock's name.
func (m *Mutex) Name() string { return m.name }

// Lock waits until the lock is granted (in order of arrival), ctx ends, or
// the session ends, and returns within milliseconds of either, even if etcd
// cannot be reached. On error, what the attempt left in etcd (its waiting
// key) is removed by the session in the background, retried while the
// session lives; until then the name cannot be locked again through this
// session.
func (m *Mutex) Lock(ctx context.Context) (*Grant, error) { return m.lock(ctx, false) }

// TryLock takes the lock only if no key exists under the name (no holder, no
// waiter), in one request, and returns an error wrapping holdfast.ErrLocked
// otherwise. It writes nothing when it fails (after a transport error, what
// the request may have written is removed as after a failed Lock).
func (m *Mutex) TryLock(ctx context.Context) (*Grant, error) { return m.lock(ctx, true) }

func (m *Mutex) lock(ctx context.Context, try bool) (*Grant, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	s := m.q.s
	if err := s.alive(); err != nil {
		return nil, err
	}
	if g, ok := m.reentry.Enter(); ok {
		return g, nil
	}
	start := time.Now()
	defer s.keeper.Waiting(m.name)()
	// Every wait below ends when the session does.
	ctx, stop := bindContext(ctx, s.keeper.Context())
	defer stop()
	var free func()
	var rev int64
	var err error
	if try {
		var ok bool
		if free, ok = s.names.TryAcquire(m.name); !ok {
			return nil, fmt.Errorf("%w: %s is being taken through this session", holdfast.ErrLocked, m.name)
		}
		rev, err = m.q.tryAcquire(ctx)
	} else {
		if free, err = s.names.Acquire(ctx, m.name); err != nil {
			return nil, m.fail(ctx, err)
		}
		rev, err = m.q.acquire(ctx)
	}
	if err == nil {
		err = s.alive() // never hand out a grant of a session already lost
	}
	if err != nil {
		if try && (errors.Is(err, holdfast.ErrLocked) || errors.Is(err, holdfast.ErrConflict)) ||
			rev == 0 && errors.Is(storeErr(err), holdfast.ErrPermissionDenied) {
			free() // refused: nothing was written
		} else {
			m.q.cleanup(rev, free)
		}
		return nil, m.fail(ctx, err)
	}
	g := &Grant{s: s, pfx: m.q.pfx, rev: rev, from: rev + 1}
	g.base = core.NewGrant(s.keeper, s.bg, m.q.key, holdfast.Token(rev), g.release, func() {
		s.watcher.remove(g)
		free()
	})
	time.AfterFunc(watchDelay, func() { s.watcher.add(g) })
	g.base.Observed(m.name, start)
	m.reentry.Remember(g, g.base)
	return g, nil
}

// fail is the error of a failed Lock or TryLock: the session's end if that
// is why (ErrSessionLost or ErrSessionClosed), else ctx's error if it ended,
// else the store's error.
func (m *Mutex) fail(ctx context.Context, err error) error {
	if serr := m.q.s.alive(); serr != nil {
		return fmt.Errorf("holdfast/etcd: lock %s: %w", m.name, serr)
	}
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("holdfast/etcd: lock %s: %w (%v)", m.name, ctx.Err(), err)
	}
	if errors.Is(storeErr(err), holdfast.ErrSessionLost) {
		m.q.s.keeper.End(fmt.Errorf("%w: lease %x not found", holdfast.ErrSessionLost, int64(m.q.s.lease)))
	}
	return fmt.Errorf("holdfast/etcd: lock %s: %w", m.name, storeErr(err))
}
