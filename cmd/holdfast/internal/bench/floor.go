package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ImplFloor is the floor: the cheapest way the store allows to pass a turn
// from one client to the next, with no safety at all (see the package doc).
const ImplFloor = "floor"

// floorTarget is a Target that has a floor implementation.
type floorTarget interface {
	// FloorImpl returns the floor relay on this store.
	FloorImpl() Impl
}

// floorImpl returns t's floor, or nil if it has none.
func floorImpl(t Target) Impl {
	if ft, ok := t.(floorTarget); ok {
		return ft.FloorImpl()
	}
	return nil
}

// floorKey is contender i's key in the relay named lock.
func floorKey(lock string, i int) string { return lock + "/floor/" + strconv.Itoa(i) }

// errFloorConfig is returned for a ContenderConfig without a valid Index and
// Count.
var errFloorConfig = errors.New("bench: the floor needs each contender's Index and the Count")

func checkFloorConfig(cfg ContenderConfig) error {
	if cfg.Count < 1 || cfg.Index < 0 || cfg.Index >= cfg.Count || cfg.Tokens < 0 {
		return fmt.Errorf("%w (index %d, count %d, tokens %d)", errFloorConfig, cfg.Index, cfg.Count, cfg.Tokens)
	}
	return nil
}

// initialTurns is how many turns contender cfg.Index starts with: one for
// each of the first Tokens contenders (at least one token), and the tokens
// beyond Count go round again.
func initialTurns(cfg ContenderConfig) int {
	tokens := max(1, cfg.Tokens)
	turns := tokens / cfg.Count
	if cfg.Index < tokens%cfg.Count {
		turns++
	}
	return turns
}

// FloorImpl implements floorTarget: a relay of watches. Contender i watches
// its own key; its Lock returns when that key is written (a turn), and its
// Unlock writes contender i+1's key (mod n). Contender 0 holds the first
// turn (contenders 0 to Tokens-1 one each for a semaphore's floor); each
// put event is one turn.
func (t *EtcdTarget) FloorImpl() Impl { return etcdFloor{t} }

type etcdFloor struct{ t *EtcdTarget }

func (etcdFloor) Name() string { return ImplFloor }

func (i etcdFloor) NewContender(ctx context.Context, cfg ContenderConfig) (Contender, error) {
	if err := checkFloorConfig(cfg); err != nil {
		return nil, err
	}
	cli, err := i.t.newClient(cfg.Counter)
	if err != nil {
		return nil, err
	}
	own := floorKey(cfg.Lock, cfg.Index)
	// The watch starts after the revision read here, so that no write to
	// the key made after NewContender returns can be missed.
	resp, err := cli.Get(ctx, own)
	if err != nil {
		cli.Close()
		return nil, err
	}
	wctx, stop := context.WithCancel(context.Background())
	c := &etcdFloorContender{
		cli:  cli,
		own:  own,
		next: floorKey(cfg.Lock, (cfg.Index+1)%cfg.Count),
		wch:  cli.Watch(wctx, own, clientv3.WithRev(resp.Header.Revision+1)),
		stop: stop,
	}
	c.pending = initialTurns(cfg)
	return c, nil
}

type etcdFloorContender struct {
	cli  *clientv3.Client
	own  string
	next string
	wch  clientv3.WatchChan
	stop context.CancelFunc
	// pending counts turns received and not yet returned by Lock; only the
	// contender's own goroutine touches it.
	pending int
	seq     int64
}

func (c *etcdFloorContender) Lock(ctx context.Context) (Held, error) {
	for c.pending == 0 {
		select {
		case <-ctx.Done():
			return Held{}, ctx.Err()
		case wr, ok := <-c.wch:
			if !ok {
				return Held{}, errors.New("floor: watch closed")
			}
			if err := wr.Err(); err != nil {
				return Held{}, fmt.Errorf("floor: watch: %w", err)
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					c.pending++
				}
			}
		}
	}
	c.pending--
	return Held{Unlock: c.pass}, nil
}

// pass writes the next contender's key: one Put.
func (c *etcdFloorContender) pass(ctx context.Context) error {
	c.seq++
	_, err := c.cli.Put(ctx, c.next, strconv.FormatInt(c.seq, 10))
	return err
}

func (c *etcdFloorContender) SessionID() string { return "" }

// Close deletes the contender's own key and closes the client.
func (c *etcdFloorContender) Close() error {
	c.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.cli.Delete(ctx, c.own)
	c.cli.Close()
	return err
}

// FloorImpl implements floorTarget: a relay of blocking queries. Contender
// i creates its own key, then blocks on it (a GET with ?index= its last
// ModifyIndex); its Lock returns when the key's ModifyIndex moves (a turn),
// and its Unlock writes contender i+1's key (mod n). Contender 0 holds the
// first turn (contenders 0 to Tokens-1 one each for a semaphore's floor).
// Each key has one writer, its predecessor, which writes the number of
// turns it has passed so far: a blocking query that sees two writes at once
// (several tokens) still counts both turns.
func (t *ConsulTarget) FloorImpl() Impl { return consulFloor{t} }

type consulFloor struct{ t *ConsulTarget }

func (consulFloor) Name() string { return ImplFloor }

func (i consulFloor) NewContender(ctx context.Context, cfg ContenderConfig) (Contender, error) {
	if err := checkFloorConfig(cfg); err != nil {
		return nil, err
	}
	cli, tr, err := i.t.newClient(cfg.Counter)
	if err != nil {
		return nil, err
	}
	own := floorKey(cfg.Lock, cfg.Index)
	// The key exists before anyone blocks on it: a blocking query on a
	// missing key wakes on any write to the KV store.
	wo := (&api.WriteOptions{}).WithContext(ctx)
	if _, err := cli.KV().Put(&api.KVPair{Key: own, Value: []byte("0")}, wo); err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	kv, _, err := cli.KV().Get(own, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err == nil && kv == nil {
		err = errors.New("not found after it was written")
	}
	if err != nil {
		tr.CloseIdleConnections()
		return nil, fmt.Errorf("floor: read own key %s: %w", own, err)
	}
	c := &consulFloorContender{cli: cli, tr: tr, own: own, next: floorKey(cfg.Lock, (cfg.Index+1)%cfg.Count), index: kv.ModifyIndex}
	c.pending = initialTurns(cfg)
	return c, nil
}

type consulFloorContender struct {
	cli       *api.Client
	tr        *http.Transport
	own, next string
	index     uint64 // ModifyIndex of the own key's last write seen
	got       int64  // turns received: the own key's last value seen
	pending   int
	seq       int64 // turns passed: the value written to the next key
	closeOnce sync.Once
}

// floorWait is the wait of each blocking query; it only bounds how long a
// query lasts, a timed-out query is simply made again.
const floorWait = 10 * time.Second

func (c *consulFloorContender) Lock(ctx context.Context) (Held, error) {
	for c.pending == 0 {
		kv, _, err := c.cli.KV().Get(c.own, (&api.QueryOptions{WaitIndex: c.index, WaitTime: floorWait}).WithContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return Held{}, ctx.Err()
			}
			return Held{}, fmt.Errorf("floor: blocking query: %w", err)
		}
		if kv != nil && kv.ModifyIndex > c.index {
			c.index = kv.ModifyIndex
			v, err := strconv.ParseInt(string(kv.Value), 10, 64)
			if err != nil || v < c.got {
				return Held{}, fmt.Errorf("floor: bad turn count %q after %d", kv.Value, c.got)
			}
			c.pending += int(v - c.got)
			c.got = v
		}
	}
	c.pending--
	return Held{Unlock: c.pass}, nil
}

// pass writes the next contender's key: one PUT.
func (c *consulFloorContender) pass(ctx context.Context) error {
	c.seq++
	_, err := c.cli.KV().Put(&api.KVPair{Key: c.next, Value: []byte(strconv.FormatInt(c.seq, 10))}, (&api.WriteOptions{}).WithContext(ctx))
	return err
}

func (c *consulFloorContender) SessionID() string { return "" }

// Close deletes the contender's own key.
func (c *consulFloorContender) Close() error {
	var err error
	c.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = c.cli.KV().Delete(c.own, (&api.WriteOptions{}).WithContext(ctx))
		c.tr.CloseIdleConnections()
	})
	return err
}
