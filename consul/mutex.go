package consul

import (
	"context"
	"fmt"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
	"github.com/holdfast/holdfast/internal/options"
)

const (
	// lockSuffix makes the lock key of a name: what `consul lock <name>` and
	// api.Lock with LockOptions{Key: name + "/.lock"} use.
	lockSuffix = "/.lock"
	// queueInfix makes the queue prefix of a name; waiters' keys are
	// "<name>/.queue/<session ID>".
	queueInfix = "/.queue/"
	// cleanupGrace is how long a Lock whose context has ended still waits
	// for its cleanup, so that on a reachable Consul it leaves nothing when
	// it returns.
	cleanupGrace = 50 * time.Millisecond
)

// LockKey returns the Consul key of the lock called name: "<name>/.lock".
// An api.Lock on LockOptions{Key: LockKey(name)}, or `consul lock name cmd`,
// excludes holdfast's Mutex on name and the other way round.
func LockKey(name string) string { return name + lockSuffix }

// Mutex is a distributed, fair (FIFO), fenced lock on Consul.
//
// The lock is the key "<name>/.lock", acquired with the session and flagged
// like api.Lock's (api.LockFlagValue), so api.Lock and `consul lock` users of
// the same key exclude holdfast and the other way round. holdfast waiters
// queue under "<name>/.queue/<session ID>" ("<name>/.tail" names the last
// one while somebody queues); a release wakes one waiter, and what an
// acquisition costs does not grow with the queue (see docs/DESIGN.md).
// Foreign clients do not queue: they get the lock only when it is free and
// no holdfast waiter queues. Consul's lock never lets two sessions hold it.
//
// Names nest as on etcd: a Mutex on "a" fails with holdfast.ErrConflict if
// it finds a live lock under "a/" (a key held by a session, such as
// "a/b/.lock" while "a/b" is held), and leaves nothing behind. Keys that no
// session holds (plain data such as "a/config", the key of an api.Semaphore
// contender whose session ended) are nobody's lock: they are ignored and
// left alone.
//
// A Mutex belongs to one Session. Lock and TryLock may be called from many
// goroutines: through one Session, acquisitions of the same name take turns
// in-process, since they share one queue key.
type Mutex struct {
	s           *Session
	name        string
	prefix      string // "<name>/"
	lockKey     string
	tailKey     string
	queuePrefix string
	queueKey    string
	reentry     core.Reentry[*Grant]
}

var _ holdfast.GrantLocker[*Grant] = (*Mutex)(nil)

// NewMutex returns the lock called name, taken through session s. The name
// follows holdfast.ValidateName (no leading "/", no segment starting with
// "."). Options: holdfast.WithReentrant.
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
	queueKey := name + queueInfix + s.id // the other keys share its bytes
	return &Mutex{
		s:           s,
		name:        queueKey[:len(name)],
		prefix:      queueKey[:len(name)+1],
		lockKey:     LockKey(name),
		tailKey:     name + tailSuffix,
		queuePrefix: queueKey[:len(name)+len(queueInfix)],
		queueKey:    queueKey,
		reentry:     core.Reentry[*Grant]{Enabled: cfg.Reentrant},
	}, nil
}

// Lock waits until the lock is granted (first come, first served among
// holdfast waiters), ctx is done, or the session ends. It returns within
// milliseconds of ctx ending, even if Consul cannot be reached: the error
// then matches ctx's error; it wraps holdfast.ErrSessionLost or
// holdfast.ErrSessionClosed if the session ended the wait, and
// holdfast.ErrConflict if the key is not a lock's or keys of a longer name
// lie under "<name>/". Whatever the call left in Consul (its queue key, or
// the lock key if an acquire of unknown outcome took it, or a holder handed
// it over as the call gave up) is removed by the session in the background,
// as soon as Consul can be reached, while the session lives; if a request
// of the call got no answer, the session looks again about 0.25, 1.25,
// 4.25 and 14.25 s later, for a request that reached Consul after the call
// gave up, and once more as it closes. Lock waits for that removal before
// it returns, but never more than 50 ms after ctx has
// ended, so on a reachable Consul a failed Lock usually leaves nothing. The
// same session locks the name again only after that removal.
func (m *Mutex) Lock(ctx context.Context) (*Grant, error) { return m.lock(ctx, false) }

// TryLock takes the lock only if nobody holds it or waits for it, and
// returns an error wrapping holdfast.ErrLocked at once otherwise (also while
// another acquisition or grant of the name through this session, or the
// cleanup after one, is under way). It writes nothing when it fails, unless
// its acquire was sent and its outcome is unknown (then it is cleaned up
// as after Lock).
func (m *Mutex) TryLock(ctx context.Context) (*Grant, error) { return m.lock(ctx, true) }

func (m *Mutex) lock(ctx context.Context, try bool) (*Grant, error) {
	return m.acquire(ctx, try, lockTaking)
}

// acquire is Lock and TryLock, and with an election's taking its Campaign
// (see campaign.go): the driver (acquire.go) runs the queue's algorithm.
func (m *Mutex) acquire(ctx context.Context, try bool, how taking) (*Grant, error) {
	return acquire(ctx, m.s, m.name, try, &m.reentry, &acquisition{m: m, how: how})
}

// grant wraps an acquired lock key in a Grant whose context is a child of the
// session's. a says whom to hand the lock to on Unlock, as far as we know.
// free releases the in-process name when the grant has ended in Consul.
func (m *Mutex) grant(token uint64, a *acquisition, free func()) (*Grant, error) {
	g := &Grant{s: m.s, prefix: m.prefix, rel: a.hold(token)}
	g.base = core.NewGrant(m.s.keeper, m.s.bg, m.lockKey, holdfast.Token(token), (*ending)(g), free)
	m.s.hold(g)
	if g.Context().Err() != nil {
		// The session ended while we acquired: hand out no grant of a dead
		// session. Close releases the key (it is in s.held).
		return nil, m.s.alive()
	}
	return g, nil
}
