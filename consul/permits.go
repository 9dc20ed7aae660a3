package consul

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// The keys that Semaphore and RWMutex share, and what a read of them says:
// permits counted in a JSON lock key "<name>/.lock" (no session, updated by
// CAS on its ModifyIndex) and contender keys "<name>/<session ID>" acquired
// with their session, api.Semaphore's layout. permitwait.go takes a permit,
// permitleave.go ends one; the steps are in docs/DESIGN.md ("Consul
// semaphore and read-write lock").

// RWMutexFlagValue is the flags value of an RWMutex's keys ("holdrwlk" in
// ASCII). api.Lock (LockFlagValue), api.Semaphore (SemaphoreFlagValue) and
// holdfast's Mutex and Semaphore refuse a lock key with these flags, and an
// RWMutex refuses theirs.
const RWMutexFlagValue uint64 = 0x686f6c6472776c6b

// Values of holdfast's contender keys. A contender key is created with its
// waiting value (the mode it waits for) and set to valHeld, in the same
// transaction as the lock-key write that admits it; so its ModifyIndex is
// then the grant's token. valHeldNext says that the same write admitted the
// next waiter in the queue too (so that waiter, which watches this key, knows
// it is admitted without a read). Keys with other values are foreign
// contenders (api.Semaphore, `consul lock -n`): holdfast never waits for
// them and never hands them a permit.
const (
	valWait     = "holdfast"       // a Semaphore's waiter
	valRead     = "holdfast read"  // an RWMutex's waiting reader
	valWrite    = "holdfast write" // an RWMutex's waiting writer
	valHeld     = "holdfast held"
	valHeldNext = "holdfast held+next"
	// valDowngraded is an RWMutex's key after Downgrade (the read grant
	// keeps the write grant's token).
	valDowngraded = "holdfast held, downgraded"
)

// permits is a Semaphore's or an RWMutex's keys and rules. What differs
// between the two follows from limit (0: an RWMutex; see kind).
type permits struct {
	s       *Session
	name    string
	prefix  string // name + "/"
	lockKey string // name + "/.lock"
	myKey   string // name + "/" + session ID: our contender key
	limit   int    // a Semaphore's; 0 for an RWMutex, which has no limit
}

func newPermits(s *Session, name string, limit int) *permits {
	myKey := name + "/" + s.id
	return &permits{
		s: s, name: myKey[:len(name)], prefix: myKey[:len(name)+1],
		lockKey: name + lockSuffix, myKey: myKey, limit: limit,
	}
}

// permitKind is what tells a Semaphore's keys from an RWMutex's.
type permitKind struct {
	what   string // for errors
	flags  uint64 // of the lock key and the contender keys
	shared string // a waiting contender's value (a Semaphore's: all)
	writer string // a waiting RWMutex writer's value
}

var (
	semaphoreKind = &permitKind{what: "semaphore", flags: api.SemaphoreFlagValue, shared: valWait, writer: valWait}
	rwKind        = &permitKind{what: "read-write lock", flags: RWMutexFlagValue, shared: valRead, writer: valWrite}
)

func (p *permits) kind() *permitKind {
	if p.limit == 0 {
		return rwKind
	}
	return semaphoreKind
}

// decode returns the lock key's state, or an error wrapping
// holdfast.ErrConflict if it is not ours to use: foreign flags, a value we
// cannot decode, or a semaphore limit other than ours.
func (p *permits) decode(lock *api.KVPair) (permitState, error) {
	k := p.kind()
	if lock == nil {
		return permitState{limit: p.limit, holders: map[string]bool{}}, nil
	}
	if lock.Flags != k.flags {
		return permitState{}, fmt.Errorf("%w: %s has flags %#x, not a %s's %#x", holdfast.ErrConflict, p.lockKey, lock.Flags, k.what, k.flags)
	}
	st, err := decodeLock(lock.Value, p.limit)
	switch {
	case err != nil:
		return permitState{}, fmt.Errorf("%w: %s: %w", holdfast.ErrConflict, p.lockKey, err)
	case st.limit != p.limit:
		return permitState{}, fmt.Errorf("%w: semaphore %s has limit %d in Consul, this client's is %d", holdfast.ErrLimitMismatch, p.name, st.limit, p.limit)
	}
	return st, nil
}

// waitValue is the value of our contender key while it waits.
func (p *permits) waitValue(exclusive bool) []byte {
	if exclusive {
		return []byte(p.kind().writer)
	}
	return []byte(p.kind().shared)
}

// fits reports whether a contender (exclusive: an RWMutex's writer) may be
// admitted beside the holders of st: within a Semaphore's limit, and with
// no writer among them (a writer alone).
func (p *permits) fits(st permitState, exclusive bool) bool {
	if p.limit > 0 && len(st.holders) >= p.limit {
		return false
	}
	if exclusive && writerAlone() && len(st.holders) > 0 {
		return false
	}
	for _, x := range st.holders {
		if x {
			return false
		}
	}
	return true
}

// contender is a holdfast contender key that waits.
type contender struct {
	key, session string
	index        uint64 // ModifyIndex
	create       uint64 // CreateIndex: the queue order
	exclusive    bool
}

// pview is what we know of the permits.
type pview struct {
	lock *api.KVPair // nil if absent
	// st: the holders, pruned of dead ones: lock and the contender keys come
	// from one snapshot (a read of the subtree), so holders whose session
	// holds no key are known dead.
	st      permitState
	waiters []contender   // holdfast waiters, by CreateIndex
	me      *api.KVPair   // our live contender key, if any
	dead    []*api.KVPair // contender keys without a session
	err     error         // why we must not use the name (ErrConflict)
	foreign bool          // a foreign contender (api.Semaphore) has a live key
	index   uint64        // the highest ModifyIndex read
}

// parse builds a view from a transaction's results that include a read of
// the subtree "<name>/" (the last answer about a key is the latest).
func (p *permits) parse(results []*api.TxnResult) pview { return p.parseKVs(latest(results)) }

// parseKVs builds a view from the keys of the subtree "<name>/", read at
// once.
func (p *permits) parseKVs(kvs []*api.KVPair) pview {
	var v pview
	k := p.kind()
	live := make(map[string]bool, len(kvs))
	ours := make(map[string]bool, len(kvs)) // keys with our kind's flags
	var keys []*api.KVPair
	for _, e := range kvs { // 1. the keys: the lock key, contenders
		v.index = max(v.index, e.ModifyIndex)
		ours[e.Key] = e.Flags == k.flags
		if e.Session != "" {
			live[e.Session] = true // api.Semaphore's rule for a live holder
		}
		if e.Key == p.lockKey {
			v.lock = e
		} else if p.contenderKey(&v, e) {
			keys = append(keys, e)
		}
	}
	st, err := p.decode(v.lock) // 2. the holders, pruned of dead ones
	switch {
	case err == nil:
	case v.lock.Flags != k.flags:
		// Another kind's lock key (deadkey.go): live, a conflict; dead,
		// our admission replaces it (its CAS at the index read).
		if l := liveUnder(kvs, v.lock, func(key string) bool { return ours[key] }); l != nil {
			v.err = otherKindError(v.lock, l, p.prefix, "a holdfast "+k.what)
		}
		st = permitState{limit: p.limit, holders: map[string]bool{}}
	default:
		v.conflict(err)
		st = permitState{limit: p.limit, holders: map[string]bool{}}
	}
	for h := range st.holders {
		if prunable(live, h) {
			delete(st.holders, h)
		}
	}
	v.st = st
	for _, e := range keys { // 3. the waiters, by CreateIndex
		if e.Key == p.myKey && e.Session == p.s.id {
			v.me = e
		}
		p.waiter(&v, e)
	}
	slices.SortFunc(v.waiters, func(x, y contender) int { return cmp.Compare(x.create, y.create) })
	return v
}

// latest returns the last answer about each key of results, in the order
// the keys first appear.
func latest(results []*api.TxnResult) []*api.KVPair {
	last := make(map[string]int, len(results))
	var kvs []*api.KVPair
	for _, r := range results {
		e := r.KV
		if e == nil {
			continue
		}
		if i, ok := last[e.Key]; ok {
			kvs[i] = e
			continue
		}
		last[e.Key] = len(kvs)
		kvs = append(kvs, e)
	}
	return kvs
}

// contenderKey reports whether e, a key other than the lock key, is a live
// contender key of ours to look at; it notes in v a key that is not ours to
// use (a conflict) or a contender key without a session (dead: ours, or
// another Semaphore's or RWMutex's). Any other key held by no session is
// nobody's lock (a plain data key, a dead Mutex's tail): left alone.
func (p *permits) contenderKey(v *pview, e *api.KVPair) bool {
	k := p.kind()
	rest, ok := strings.CutPrefix(e.Key, p.prefix)
	shaped := rest != "" && !strings.Contains(rest, "/") && !strings.HasPrefix(rest, ".")
	switch {
	case !ok:
	case e.Session == "" && shaped && (e.Flags == api.SemaphoreFlagValue || e.Flags == RWMutexFlagValue):
		v.dead = append(v.dead, e)
	case e.Session == "":
	case !shaped:
		v.conflict(fmt.Errorf("%w: %q is under %s: not a %s's key", holdfast.ErrConflict, e.Key, p.prefix, k.what))
	case e.Flags != k.flags:
		v.conflict(fmt.Errorf("%w: %s has flags %#x, not a %s contender's %#x", holdfast.ErrConflict, e.Key, e.Flags, k.what, k.flags))
	default:
		return true
	}
	return false
}

// waiter adds the live contender key e to v's waiters if it is a holdfast
// waiter of our kind; a holder's key is skipped, a foreign contender noted
// (api.Semaphore's: never waited for; an RWMutex has none: a conflict).
func (p *permits) waiter(v *pview, e *api.KVPair) {
	k := p.kind()
	c := contender{key: e.Key, session: e.Session, index: e.ModifyIndex, create: e.CreateIndex}
	switch val := string(e.Value); val {
	case valHeld, valHeldNext, valDowngraded:
		return
	case k.shared:
	case k.writer:
		c.exclusive = true
	case valWait, valRead, valWrite:
		v.conflict(fmt.Errorf("%w: %s is another holdfast primitive's contender, not a %s's", holdfast.ErrConflict, e.Key, k.what))
		return
	default:
		if k == rwKind {
			v.conflict(fmt.Errorf("%w: %s is a foreign contender: %s is not a read-write lock", holdfast.ErrConflict, e.Key, p.name))
			return
		}
		v.foreign = true // a foreign contender (api.Semaphore): never waited for
		return
	}
	v.waiters = append(v.waiters, c)
}

func (v *pview) conflict(err error) {
	if v.err == nil {
		v.err = err
	}
}

// admitted reports whether our key holds a permit in v.
func (v pview) admitted(p *permits) bool {
	if v.me == nil {
		return false
	}
	val := string(v.me.Value)
	_, in := v.st.holders[p.s.id]
	return in && (val == valHeld || val == valHeldNext || val == valDowngraded)
}

// waiting reports whether our key waits in v's queue.
func (v pview) waiting(p *permits) bool {
	return v.me != nil && slices.ContainsFunc(v.waiters, func(w contender) bool { return w.key == p.myKey })
}

// others returns the waiters other than us.
func (v pview) others(p *permits) []contender {
	return slices.DeleteFunc(slices.Clone(v.waiters), func(w contender) bool { return w.key == p.myKey })
}

// ahead returns the waiters queued before us.
func (v pview) ahead() []contender {
	var a []contender
	for _, w := range v.waiters {
		if w.create >= v.me.CreateIndex {
			break
		}
		a = append(a, w)
	}
	return a
}

// admit admits the waiters of ws in order, as long as they fit beside the
// holders of st (first come, first served: it stops at the first that does
// not fit). It returns the new state and whom it admitted.
func (p *permits) admit(st permitState, ws []contender) (permitState, []contender) {
	st = st.clone()
	var in []contender
	for _, w := range ws {
		delete(st.holders, w.session) // a stale entry of a waiting session counts for nothing
		if !p.fits(st, w.exclusive) {
			break
		}
		st.holders[w.session] = w.exclusive
		in = append(in, w)
	}
	return st, in
}

// writeOps are the operations that store st in the lock key (seen in v) and
// mark the admitted waiters' keys, so that each learns from its own key (or
// its successor from it) that it was admitted, with this write's index as
// its token.
func (p *permits) writeOps(v pview, st permitState, in []contender) api.TxnOps {
	var ops api.TxnOps
	var index uint64
	if v.lock != nil {
		index = v.lock.ModifyIndex
	}
	verb := permitCAS()
	value := encodeLock(st)
	if v.lock != nil && string(value) == string(v.lock.Value) {
		// Consul does not move the index of a write that changes nothing:
		// a newline (which JSON ignores) makes the write a change.
		value = append(value, '\n')
	}
	ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: verb, Key: p.lockKey, Index: index, Flags: p.kind().flags, Value: value}})
	for i, w := range in {
		val := valHeld
		if i+1 < len(in) {
			val = valHeldNext
		}
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: w.key, Index: w.index, Flags: p.kind().flags, Value: []byte(val)}})
	}
	return ops
}

// roomy reports whether st leaves a permit free for some contender (a
// Semaphore's permit; an RWMutex's read grant). A transaction that writes
// such a state reads the subtree after its writes, and its sender passes
// the free permits on (see passOn).
func (p *permits) roomy(st permitState) bool { return p.fits(st, false) }

// readAfter is the operation, last in a transaction, that reads the
// subtree as the transaction's writes left it.
func (p *permits) readAfter() *api.TxnOp { return kvOp(api.KVGetTree, p.prefix) }

// read returns the subtree in one read-only transaction.
func (p *permits) read(ctx context.Context) (pview, error) {
	return p.readOps(ctx, api.TxnOps{kvOp(api.KVGetTree, p.prefix)})
}

// readOrdered returns the subtree too, in a transaction that also deletes a
// key that never exists: that makes it a write, which Consul applies through
// Raft after the writes sent before it, where a read-only transaction is
// answered at once. A cleanup reads this way, so that a join or an
// admission of ours whose request was abandoned but reached the server is
// seen (and undone) rather than landing after the read.
func (p *permits) readOrdered(ctx context.Context) (pview, error) {
	return p.readOps(ctx, api.TxnOps{kvOp(api.KVDelete, p.myKey+"/.ordered"), kvOp(api.KVGetTree, p.prefix)})
}

func (p *permits) readOps(ctx context.Context, ops api.TxnOps) (pview, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := p.s.txn(ctx, ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return pview{}, txnError("read "+p.name, rb)
	case err != nil:
		return pview{}, err
	}
	return p.parse(resp.Results), nil
}
