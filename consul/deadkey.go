package consul

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// A name's lock key "<name>/.lock" written by another kind of lock (flags
// other than the caller's: a Mutex's or Election's api.LockFlagValue, a
// Semaphore's api.SemaphoreFlagValue, an RWMutex's RWMutexFlagValue) is
// dead once no session can hold it any more: the key itself is held by no
// session, and no key under the name other than the caller's own is held by
// one (the holders and waiters of api.Semaphore, `consul lock -n`, an
// RWMutex and a Mutex's queue each hold a key with their session, which
// Consul deletes or frees when the session ends). A dead key is replaced by
// the caller's own take, guarded by the index read (a check-index or a
// CAS at lock.ModifyIndex, in the same transaction as the take), so that
// the name is never without a lock key in between; a live one refuses the
// name with an error wrapping holdfast.ErrConflict that says how to free it
// (issue 25, item 7: only a live lock may refuse a name).

// deadKey reads the keys under prefix ("<name>/") and returns nil if lock,
// the lock key of another kind as the caller read it, is dead (see above):
// the caller may then replace it, guarded by lock.ModifyIndex. own reports
// the keys that are the caller's kind's own (its queue, its contender keys),
// which do not keep lock alive; what is the caller's kind ("a Mutex"). A
// live key is an error wrapping holdfast.ErrConflict (see otherKindError).
func (s *Session) deadKey(ctx context.Context, prefix string, lock *api.KVPair, own func(key string) bool, what string) error {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := s.txn(rctx, api.TxnOps{kvOp(api.KVGetTree, prefix)})
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return txnError("read "+prefix, rb)
	case err != nil:
		return err
	}
	pairs := make([]*api.KVPair, 0, len(resp.Results))
	for _, r := range resp.Results {
		if r.KV != nil {
			pairs = append(pairs, r.KV)
		}
	}
	if live := liveUnder(pairs, lock, own); live != nil {
		return otherKindError(lock, live, prefix, what)
	}
	return nil
}

// liveUnder returns the key among pairs (the keys under a name) that keeps
// lock, the name's lock key of another kind, alive: lock itself if it is
// held by a session, else the first key other than own's held by a session
// (nil: lock is dead).
func liveUnder(pairs []*api.KVPair, lock *api.KVPair, own func(key string) bool) *api.KVPair {
	if semaphoreHeld(lock) {
		return lock
	}
	for _, e := range pairs {
		if e.Key != lock.Key && semaphoreHeld(e) && !own(e.Key) {
			return e
		}
	}
	return nil
}

// otherKindError is the error for lock, the lock key of another kind under
// prefix, kept alive by live (see liveUnder): it names the kind and the
// session, and says how to free the name.
func otherKindError(lock, live *api.KVPair, prefix, what string) error {
	return fmt.Errorf("%w: %s is %s (flags %#x), and %s is held by live session %s; "+
		"%s takes the name once no session holds a key under %s (a killed holder's session holds one until Consul ends it: its TTL, or its node's check); "+
		"to free it by hand, stop that lock's users and run `consul kv delete %s`",
		holdfast.ErrConflict, lock.Key, lockKind(lock.Flags), lock.Flags, live.Key, live.Session, what, prefix, lock.Key)
}

// lockKind names the kind of lock whose keys have flags.
func lockKind(flags uint64) string {
	switch flags {
	case api.LockFlagValue:
		return "a lock's (api.Lock, `consul lock`, a holdfast Mutex or Election)"
	case api.SemaphoreFlagValue:
		return "a semaphore's (api.Semaphore, `consul lock -n`, a holdfast Semaphore)"
	case RWMutexFlagValue:
		return "a holdfast RWMutex's"
	}
	return "another kind of lock's"
}

// compatible returns an error wrapping holdfast.ErrConflict if a live lock
// lies under "<name>/": a key held by a session (a lock of a longer name,
// an api.Semaphore's contender). A key held by no session (a plain data
// key, a dead contender's) is nobody's lock: it is left alone. (A lock key
// of another kind is checked before it is taken: see Mutex.deadLock.)
func (m *Mutex) compatible(v view) error {
	if v.other != "" {
		return fmt.Errorf("%w: %q is under %s/: a lock on %s would cover a lock of a longer name", holdfast.ErrConflict, v.other, m.name, m.name)
	}
	return nil
}

// compatibleLock returns an error wrapping holdfast.ErrConflict if the lock
// key exists with flags other than a lock's (a semaphore's, say).
func (m *Mutex) compatibleLock(lock *api.KVPair) error {
	if otherKind(lock) {
		return fmt.Errorf("%w: %s has flags %#x, not a lock's %#x", holdfast.ErrConflict, m.lockKey(), lock.Flags, uint64(api.LockFlagValue))
	}
	return nil
}

// otherKind reports whether lock is the lock key of another kind of lock
// (flags other than a lock's: a semaphore's, an RWMutex's).
func otherKind(lock *api.KVPair) bool { return lock != nil && lock.Flags != api.LockFlagValue }

// deadLock returns nil if lock, the lock key as read, is a lock's, or is
// another kind's that is dead (see deadKey.go): the take then replaces it,
// guarded by its index. A live one is an error wrapping
// holdfast.ErrConflict that says how to free the name (before, a Mutex
// refused the name for ever once a `consul lock -n` was killed:
// TestDeadSemaphoreLockKey; or once an RWMutex's holder was cut off:
// TestDeadRWLockKey).
func (m *Mutex) deadLock(ctx context.Context, lock *api.KVPair) error {
	if !otherKind(lock) {
		return nil
	}
	own := func(key string) bool { return key == m.tailKey() || strings.HasPrefix(key, m.queuePrefix()) }
	return m.s.deadKey(ctx, m.prefix(), lock, own, "a holdfast Mutex or Election")
}
