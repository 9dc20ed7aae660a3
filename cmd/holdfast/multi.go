package main

import (
	"context"
	"fmt"
	"slices"
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
		return newMultiGrant(names, g), nil
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
	return newMultiGrant(names, g), nil
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
	given []string // NAME, then each --and name, as given
}

func newMultiGrant(given []string, g multiGrantOf) holdfast.Grant { return multiGrant{g, given} }

func (g multiGrant) Key() string           { return g.multiGrantOf.Key(g.given[0]) }
func (g multiGrant) Token() holdfast.Token { return g.multiGrantOf.Token(g.given[0]) }

// Env is HOLDFAST_NAMES, HOLDFAST_KEYS and HOLDFAST_TOKENS (every name,
// key and token, comma-separated, in the order the names are taken:
// sorted), and one HOLDFAST_NAME_<i>, HOLDFAST_KEY_<i> and
// HOLDFAST_TOKEN_<i> per name in the order of the command line (i from 1:
// NAME, then each --and; a repeated name, locked once, has each of its
// positions, so that _<i> is always the i-th name given).
func (g multiGrant) Env() []string {
	names := g.Names()
	keys := make([]string, len(names))
	tokens := make([]string, len(names))
	for i, n := range names {
		keys[i], tokens[i] = g.multiGrantOf.Key(n), g.multiGrantOf.Token(n).String()
	}
	env := []string{"HOLDFAST_NAMES=" + strings.Join(names, ","), "HOLDFAST_KEYS=" + strings.Join(keys, ","), "HOLDFAST_TOKENS=" + strings.Join(tokens, ",")}
	for i, n := range g.given {
		env = append(env, fmt.Sprintf("HOLDFAST_NAME_%d=%s", i+1, n), fmt.Sprintf("HOLDFAST_KEY_%d=%s", i+1, g.multiGrantOf.Key(n)), fmt.Sprintf("HOLDFAST_TOKEN_%d=%s", i+1, g.multiGrantOf.Token(n)))
	}
	return env
}

// ordered is the names in the order of the command line, each once.
func (g multiGrant) ordered() []string {
	var names []string
	for _, n := range g.given {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

// Tokens says every name's token for -v, in the order of the command
// line: "tokens acct/b 12, acct/a 11".
func (g multiGrant) Tokens() string {
	var parts []string
	for _, n := range g.ordered() {
		parts = append(parts, fmt.Sprintf("%s %s", n, g.multiGrantOf.Token(n)))
	}
	return "tokens " + strings.Join(parts, ", ")
}

// tokens says g's token for -v: "token 12", or every name's for a
// multi-name grant.
func tokens(g holdfast.Grant) string {
	if m, ok := g.(multiGrant); ok {
		return m.Tokens()
	}
	return "token " + g.Token().String()
}
