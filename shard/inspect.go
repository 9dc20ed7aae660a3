package shard

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
)

// State is what the store holds of a group, as Inspect reads it.
type State struct {
	// Name is the group's name.
	Name string
	// Members are the live members, by ID.
	Members []Member
	// Shards are the group's shards (none if no member runs the group:
	// the shards' number is in the members' keys).
	Shards []ShardState
}

// Member is one live member of a group.
type Member struct {
	// ID is the member's session: the etcd lease ID in hex, or the Consul
	// session ID.
	ID string
	// Name is Config.Member ("" if not set).
	Name string
	// Shards is how many shards the member holds now.
	Shards int
}

// ShardState is who owns a shard and who waits for it.
type ShardState struct {
	Shard Shard
	// Owner is the ID of the member whose session holds the shard's lock,
	// "" if nobody holds it.
	Owner string
	// Token is the owner's fencing token (0 if free).
	Token holdfast.Token
	// Waiters are the IDs of the sessions waiting for the lock, in the
	// order the store serves them.
	Waiters []string
}

// Inspect reads the state of the group called name through s's client,
// writing nothing: one read of the members' keys, then one per shard.
func (s *Store[G]) Inspect(ctx context.Context, name string) (*State, error) {
	if s == nil || s.b == nil {
		return nil, fmt.Errorf("%w: shard.Inspect: nil store", holdfast.ErrInvalidArgument)
	}
	return inspect(ctx, s.b, name)
}

// InspectEtcd is Inspect through an etcd client, without a session.
func InspectEtcd(ctx context.Context, c *clientv3.Client, name string) (*State, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: shard.InspectEtcd: nil client", holdfast.ErrInvalidArgument)
	}
	return inspect(ctx, etcdReader{c}, name)
}

// InspectConsul is Inspect through a Consul client, without a session.
func InspectConsul(ctx context.Context, c *api.Client, name string) (*State, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: shard.InspectConsul: nil client", holdfast.ErrInvalidArgument)
	}
	return inspect(ctx, consulReader{c}, name)
}

func inspect(ctx context.Context, r reader, name string) (*State, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: shard.Inspect: nil context", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, fmt.Errorf("shard.Inspect: %w", err)
	}
	entries, err := r.list(ctx, name+membersInfix)
	if err != nil {
		return nil, fmt.Errorf("shard.Inspect %s: %w", name, err)
	}
	st := &State{Name: name}
	var names []string
	index := map[string]int{}
	for _, e := range entries {
		if e.session == "" || e.session == "0" {
			continue
		}
		var v memberValue
		if json.Unmarshal(e.value, &v) != nil {
			continue
		}
		id := strings.TrimPrefix(e.key, name+membersInfix)
		index[id] = len(st.Members)
		st.Members = append(st.Members, Member{ID: id, Name: v.Member})
		if names == nil && v.Shards > 0 {
			names = v.Names
			if names == nil {
				for i := range v.Shards {
					names = append(names, strconv.Itoa(i))
				}
			}
		}
	}
	for i, n := range names {
		ls, err := r.inspect(ctx, name+"/"+n)
		if err != nil {
			return nil, fmt.Errorf("shard.Inspect %s: shard %s: %w", name, n, err)
		}
		ss := ShardState{Shard: Shard{Index: i, Name: n}}
		if len(ls.Holders) > 0 {
			ss.Owner, ss.Token = ls.Holders[0].Session, ls.Holders[0].Token
			if m, ok := index[ss.Owner]; ok {
				st.Members[m].Shards++
			}
		}
		for _, w := range ls.Waiters {
			ss.Waiters = append(ss.Waiters, w.Session)
		}
		st.Shards = append(st.Shards, ss)
	}
	return st, nil
}
