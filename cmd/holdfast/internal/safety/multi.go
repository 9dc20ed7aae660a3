package safety

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/etcd"
)

// Multi is the multi-name lock as a scenario's primitive: each client
// locks the scenario's name and a second one (the name + "-pair"), passing
// them in a random order each time, as one grant. The checkers watch the
// scenario's name (its token fences the writes); the pair is what makes two
// clients' acquisitions able to deadlock if the canonical order broke. It
// is not part of Primitives ("all"): ask for it by name.
const Multi Primitive = "multi"

// multiPair returns the scenario's two names in a random order.
func multiPair(name string) []string {
	names := []string{name, name + "-pair"}
	if rand.IntN(2) == 0 {
		names[0], names[1] = names[1], names[0]
	}
	return names
}

// multiGrantOf is what both backends' MultiGrant offer.
type multiGrantOf interface {
	Key(name string) string
	Token(name string) holdfast.Token
	Context() context.Context
	Deadline() time.Time
	Unlock(ctx context.Context) error
}

// multiGrant is a multi-name grant seen as the grant of its main name.
type multiGrant struct {
	multiGrantOf
	main string
}

func (g multiGrant) Key() string           { return g.multiGrantOf.Key(g.main) }
func (g multiGrant) Token() holdfast.Token { return g.multiGrantOf.Token(g.main) }

// multiLocker adapts a multi-name lock of name and its pair to
// holdfast.Locker.
type multiLocker[G multiGrantOf] struct {
	name string
	lock func(ctx context.Context, try bool, names []string) (G, error)
}

func (l multiLocker[G]) Lock(ctx context.Context) (holdfast.Grant, error) {
	return l.take(ctx, false)
}

func (l multiLocker[G]) TryLock(ctx context.Context) (holdfast.Grant, error) {
	return l.take(ctx, true)
}

func (l multiLocker[G]) take(ctx context.Context, try bool) (holdfast.Grant, error) {
	g, err := l.lock(ctx, try, multiPair(l.name))
	if err != nil {
		return nil, err
	}
	return multiGrant{g, l.name}, nil
}

// etcdMulti returns the Multi primitive on an etcd session.
func etcdMulti(s *etcd.Session, name string) holdfast.Locker {
	return multiLocker[*etcd.MultiGrant]{name: name, lock: func(ctx context.Context, try bool, names []string) (*etcd.MultiGrant, error) {
		m, err := etcd.NewMultiMutex(s, names...)
		if err != nil {
			return nil, err
		}
		if try {
			return m.TryLock(ctx)
		}
		return m.Lock(ctx)
	}}
}

// consulMulti returns the Multi primitive on a Consul session.
func consulMulti(s *consul.Session, name string) holdfast.Locker {
	return multiLocker[*consul.MultiGrant]{name: name, lock: func(ctx context.Context, try bool, names []string) (*consul.MultiGrant, error) {
		m, err := consul.NewMultiMutex(s, names...)
		if err != nil {
			return nil, err
		}
		if try {
			return m.TryLock(ctx)
		}
		return m.Lock(ctx)
	}}
}
