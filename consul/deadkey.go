package consul

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// liveUnder returns nil if lock, a name's lock key of another kind, is
// dead: no session holds it, nor a key among pairs (the keys under the name)
// but own's (every contender of a Semaphore, an RWMutex, `consul lock -n`
// and a Mutex's queue holds one). The caller's take then replaces it,
// guarded by the index read. Live, the error wraps holdfast.ErrConflict and
// says how to free the name; what is the caller's kind ("a Mutex").
func liveUnder(pairs []*api.KVPair, lock *api.KVPair, own func(*api.KVPair) bool, what string) error {
	live := lock
	if !semaphoreHeld(lock) {
		i := slices.IndexFunc(pairs, func(e *api.KVPair) bool { return e.Key != lock.Key && semaphoreHeld(e) && !own(e) })
		if i < 0 {
			return nil
		}
		live = pairs[i]
	}
	kind := cmp.Or(map[uint64]string{
		api.LockFlagValue:      "a lock's (api.Lock, `consul lock`, a holdfast Mutex or Election)",
		api.SemaphoreFlagValue: "a semaphore's (api.Semaphore, `consul lock -n`, a holdfast Semaphore)",
		RWMutexFlagValue:       "a holdfast RWMutex's",
	}[lock.Flags], "another kind of lock's")
	return fmt.Errorf("%w: %s is %s (flags %#x), and %s is held by live session %s; "+
		"%s takes the name once no session holds a key under %s (a killed holder's session holds one until Consul ends it: its TTL, or its node's check); "+
		"to free it by hand, stop that lock's users and run `consul kv delete %s`",
		holdfast.ErrConflict, lock.Key, kind, lock.Flags, live.Key, live.Session, what, strings.TrimSuffix(lock.Key, ".lock"), lock.Key)
}

// compatible returns an error wrapping holdfast.ErrConflict if a live lock
// (a longer name's, a semaphore's contender) lies under "<name>/".
func (m *Mutex) compatible(v view) error {
	if v.other != "" {
		return fmt.Errorf("%w: %q is under %s/: a lock on %s would cover a lock of a longer name", holdfast.ErrConflict, v.other, m.name, m.name)
	}
	return nil
}

// compatibleLock returns an error wrapping holdfast.ErrConflict if lock is
// another kind's (a semaphore's, say).
func (m *Mutex) compatibleLock(lock *api.KVPair) error {
	if otherKind(lock) {
		return fmt.Errorf("%w: %s has flags %#x, not a lock's %#x", holdfast.ErrConflict, m.lockKey(), lock.Flags, uint64(api.LockFlagValue))
	}
	return nil
}

// otherKind reports whether lock is the lock key of another kind of lock.
func otherKind(lock *api.KVPair) bool { return lock != nil && lock.Flags != api.LockFlagValue }

// deadLock returns nil if lock, the lock key as read, is a lock's or a dead
// one of another kind (see liveUnder), else its error.
func (m *Mutex) deadLock(ctx context.Context, lock *api.KVPair) error {
	if !otherKind(lock) {
		return nil
	}
	resp, err := m.s.txn(ctx, api.TxnOps{kvOp(api.KVGetTree, m.prefix())})
	if err != nil {
		return err
	}
	own := func(e *api.KVPair) bool { return e.Key == m.tailKey() || strings.HasPrefix(e.Key, m.queuePrefix()) }
	return liveUnder(latest(resp.Results), lock, own, "a holdfast Mutex or Election")
}
