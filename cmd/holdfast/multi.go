package main

import (
	"context"
	"strings"
	"time"

	"github.com/holdfast/holdfast"
	hfconsul "github.com/holdfast/holdfast/consul"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

// nameList is a repeatable flag of lock names (lock --and).
type nameList []string

func (l *nameList) String() string { return strings.Join(*l, ",") }

func (l *nameList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// multiLock takes name and also as one multi-name lock through s, and
// returns it as a holdfast.Grant whose key and token are name's (see
// multiGrant).
func multiLock(ctx context.Context, s *session, name string, also []string, try bool) (holdfast.Grant, error) {
	names := append([]string{name}, also...)
	if s.etcd != nil {
		m, err := hfetcd.NewMultiMutex(s.etcd, names...)
		if err != nil {
			return nil, err
		}
		lock := m.Lock
		if try {
			lock = m.TryLock
		}
		g, err := lock(ctx)
		if err != nil {
			return nil, err
		}
		return newMultiGrant(name, g), nil
	}
	m, err := hfconsul.NewMultiMutex(s.consul, names...)
	if err != nil {
		return nil, err
	}
	lock := m.Lock
	if try {
		lock = m.TryLock
	}
	g, err := lock(ctx)
	if err != nil {
		return nil, err
	}
	return newMultiGrant(name, g), nil
}

// multiGrantOf is what both backends' MultiGrant offer.
type multiGrantOf interface {
	Names() []string
	Key(name string) string
	Token(name string) holdfast.Token
	Context() context.Context
	Deadline() time.Time
	Unlock(ctx context.Context) error
}

// multiGrant is a multi-name grant as lock's runner uses it: Key and Token
// are those of the main name (NAME), so HOLDFAST_KEY and HOLDFAST_TOKEN mean
// what they mean for one name; Env adds every name's.
type multiGrant struct {
	multiGrantOf
	main string
}

func newMultiGrant(main string, g multiGrantOf) holdfast.Grant { return multiGrant{g, main} }

func (g multiGrant) Key() string           { return g.multiGrantOf.Key(g.main) }
func (g multiGrant) Token() holdfast.Token { return g.multiGrantOf.Token(g.main) }

// Env is HOLDFAST_NAMES, HOLDFAST_KEYS and HOLDFAST_TOKENS: every name,
// key and token, comma-separated, in the order the names are taken
// (sorted).
func (g multiGrant) Env() []string {
	names := g.Names()
	keys := make([]string, len(names))
	tokens := make([]string, len(names))
	for i, n := range names {
		keys[i], tokens[i] = g.multiGrantOf.Key(n), g.multiGrantOf.Token(n).String()
	}
	return []string{"HOLDFAST_NAMES=" + strings.Join(names, ","), "HOLDFAST_KEYS=" + strings.Join(keys, ","), "HOLDFAST_TOKENS=" + strings.Join(tokens, ",")}
}
