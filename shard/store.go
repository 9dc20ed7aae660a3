package shard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/internal/core"
)

// Store is one member's access to a store: its session, through which it
// holds the shards' locks and its membership key. Make it with Etcd or
// Consul. G is the backend's grant type.
type Store[G holdfast.Grant] struct {
	b backend[G]
}

// Etcd returns the Store of a member on etcd, through session s. The
// member's ID is the session's lease ID in hex; the shard locks are
// etcd.Mutex locks, and the membership key is bound to the lease.
func Etcd(s *etcd.Session) *Store[*etcd.Grant] {
	if s == nil {
		return nil
	}
	return &Store[*etcd.Grant]{etcdBackend{s: s, etcdReader: etcdReader{s.Client()}}}
}

// Consul returns the Store of a member on Consul, through session s. The
// member's ID is the session's ID; the shard locks are consul.Mutex locks,
// and the membership key is acquired with the session.
func Consul(s *consul.Session) *Store[*consul.Grant] {
	if s == nil {
		return nil
	}
	return &Store[*consul.Grant]{consulBackend{s: s, consulReader: consulReader{s.Client()}}}
}

// entry is a key under a prefix: its value and the session that holds it.
type entry struct {
	key, session string
	value        []byte
}

// reader reads a group's keys, writing nothing.
type reader interface {
	list(ctx context.Context, prefix string) ([]entry, error)
	inspect(ctx context.Context, name string) (*holdfast.State, error)
}

// backend is what a group needs of a store, through one session.
type backend[G holdfast.Grant] interface {
	reader
	// id is the session's ID as Inspect reports it (Contender.Session).
	id() string
	// done is the session's context.
	done() context.Context
	mutex(name string) (holdfast.GrantLocker[G], error)
	// join writes key with value, held by the session.
	join(ctx context.Context, key string, value []byte) error
	// leave deletes key if the session holds it.
	leave(ctx context.Context, key string) error
	// watch sends the keys under prefix held by a live session, at once
	// and after each change, until ctx ends. A send replaces a view the
	// receiver has not taken yet (out has a buffer of one).
	watch(ctx context.Context, prefix string, out chan []entry)
}

// send replaces what out holds with v.
func send(out chan []entry, v []entry) {
	for {
		select {
		case out <- v:
			return
		default:
		}
		select {
		case <-out:
		default:
		}
	}
}

// watchBackoff paces the retries of a failed watch or list.
var watchBackoff = core.Backoff{First: core.RetryFirstPause, Max: time.Second, Final: func(error) bool { return false }}

type etcdReader struct{ c *clientv3.Client }

func (r etcdReader) list(ctx context.Context, prefix string) ([]entry, error) {
	resp, err := r.c.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	var out []entry
	for _, kv := range resp.Kvs {
		out = append(out, entry{string(kv.Key), fmt.Sprintf("%x", kv.Lease), kv.Value})
	}
	return out, nil
}

func (r etcdReader) inspect(ctx context.Context, name string) (*holdfast.State, error) {
	return etcd.Inspect(ctx, r.c, name)
}

type etcdBackend struct {
	etcdReader
	s *etcd.Session
}

func (b etcdBackend) id() string            { return fmt.Sprintf("%x", b.s.Lease()) }
func (b etcdBackend) done() context.Context { return b.s.Context() }
func (b etcdBackend) mutex(name string) (holdfast.GrantLocker[*etcd.Grant], error) {
	return etcd.NewMutex(b.s, name)
}

func (b etcdBackend) join(ctx context.Context, key string, value []byte) error {
	resp, err := b.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(value), clientv3.WithLease(b.s.Lease()))).
		Commit()
	if err != nil {
		return fmt.Errorf("shard: join %s: %w", key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: shard: %s exists: the member already runs this group", ErrMemberRunning, key)
	}
	return nil
}

func (b etcdBackend) leave(ctx context.Context, key string) error {
	_, err := b.c.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(key), "=", b.s.Lease())).
		Then(clientv3.OpDelete(key)).
		Commit()
	return err
}

func (b etcdBackend) watch(ctx context.Context, prefix string, out chan []entry) {
	for ctx.Err() == nil {
		var resp *clientv3.GetResponse
		if watchBackoff.Retry(ctx, func(ctx context.Context) (err error) {
			resp, err = b.c.Get(ctx, prefix, clientv3.WithPrefix())
			return err
		}) != nil {
			return
		}
		live := map[string]entry{}
		for _, kv := range resp.Kvs {
			live[string(kv.Key)] = entry{string(kv.Key), fmt.Sprintf("%x", kv.Lease), kv.Value}
		}
		send(out, sorted(live))
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range b.c.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				k := string(ev.Kv.Key)
				if ev.Type == clientv3.EventTypeDelete {
					delete(live, k)
				} else {
					live[k] = entry{k, fmt.Sprintf("%x", ev.Kv.Lease), ev.Kv.Value}
				}
			}
			send(out, sorted(live))
		}
		cancel()
		if ctx.Err() == nil {
			core.Sleep(ctx, core.RetryFirstPause)
		}
	}
}

func sorted(m map[string]entry) []entry {
	out := make([]entry, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	return out
}

type consulReader struct{ c *api.Client }

func (r consulReader) list(ctx context.Context, prefix string) ([]entry, error) {
	pairs, _, err := r.c.KV().List(prefix, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, err
	}
	return held(pairs), nil
}

// held returns the pairs a session holds.
func held(pairs api.KVPairs) []entry {
	var out []entry
	for _, p := range pairs {
		if p.Session != "" {
			out = append(out, entry{p.Key, p.Session, p.Value})
		}
	}
	return out
}

func (r consulReader) inspect(ctx context.Context, name string) (*holdfast.State, error) {
	return consul.Inspect(ctx, r.c, name)
}

type consulBackend struct {
	consulReader
	s *consul.Session
}

func (b consulBackend) id() string            { return b.s.ID() }
func (b consulBackend) done() context.Context { return b.s.Context() }
func (b consulBackend) mutex(name string) (holdfast.GrantLocker[*consul.Grant], error) {
	return consul.NewMutex(b.s, name)
}

func (b consulBackend) join(ctx context.Context, key string, value []byte) error {
	ok, _, err := b.c.KV().Acquire(&api.KVPair{Key: key, Value: value, Session: b.s.ID()}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("shard: join %s: %w", key, err)
	}
	if !ok {
		return fmt.Errorf("shard: join %s: %w", key, holdfast.ErrConflict)
	}
	return nil
}

func (b consulBackend) leave(ctx context.Context, key string) error {
	ok, resp, _, err := b.c.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: key, Session: b.s.ID()}},
		{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: key}},
	}, (&api.QueryOptions{}).WithContext(ctx))
	if err == nil && !ok && resp != nil && len(resp.Errors) > 0 {
		return errors.New(resp.Errors[0].What)
	}
	return err
}

func (b consulBackend) watch(ctx context.Context, prefix string, out chan []entry) {
	var index uint64
	var last []entry
	first := true
	kv := b.c.KV()
	for ctx.Err() == nil {
		var pairs api.KVPairs
		var meta *api.QueryMeta
		if watchBackoff.Retry(ctx, func(ctx context.Context) (err error) {
			pairs, meta, err = kv.List(prefix, (&api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx))
			return err
		}) != nil {
			return
		}
		if meta.LastIndex < index {
			index = 0 // the index went back (a snapshot restore): start over
		} else {
			index = meta.LastIndex
		}
		live := held(pairs)
		if first || !slices.EqualFunc(live, last, sameEntry) {
			send(out, live)
			last, first = live, false
		}
		// A crashed member's key outlives its session (Consul releases
		// it): delete it, unless someone acquired it since.
		for _, p := range pairs {
			if p.Session == "" {
				_, _, _ = kv.DeleteCAS(p, (&api.WriteOptions{}).WithContext(ctx))
			}
		}
	}
}

func sameEntry(a, b entry) bool {
	return a.key == b.key && a.session == b.session && string(a.value) == string(b.value)
}
