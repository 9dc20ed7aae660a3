package consul

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// This file is the engine that Semaphore and RWMutex share: permits counted
// in a JSON lock key "<name>/.lock" (no session, updated by CAS on its
// ModifyIndex) and contender keys "<name>/<session ID>" acquired with their
// session, api.Semaphore's layout. See Semaphore for the algorithm.

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

// maxLeaveAttempts bounds the attempts of one release or cleanup before it
// reports errStale (and core.Retry tries again after a pause).
const maxLeaveAttempts = 8

// permits is a Semaphore's or an RWMutex's keys and rules.
type permits struct {
	s       *Session
	kind    string // "semaphore" or "read-write lock", for errors
	name    string
	prefix  string // name + "/"
	lockKey string // name + "/.lock"
	myKey   string // name + "/" + session ID: our contender key
	flags   uint64
	limit   int // a Semaphore's; 0 for an RWMutex
}

func newPermits(s *Session, kind, name string, flags uint64, limit int) *permits {
	myKey := name + "/" + s.id
	return &permits{
		s: s, kind: kind, name: myKey[:len(name)], prefix: myKey[:len(name)+1],
		lockKey: name + lockSuffix, myKey: myKey, flags: flags, limit: limit,
	}
}

func (p *permits) rw() bool { return p.limit == 0 }

// decode returns the lock key's state, or an error wrapping
// holdfast.ErrConflict if it is not ours to use: foreign flags, a value we
// cannot decode, or a semaphore limit other than ours.
func (p *permits) decode(lock *api.KVPair) (permitState, error) {
	if lock == nil {
		return permitState{limit: p.limit, holders: map[string]bool{}}, nil
	}
	if lock.Flags != p.flags {
		return permitState{}, fmt.Errorf("%w: %s has flags %#x, not a %s's %#x", holdfast.ErrConflict, p.lockKey, lock.Flags, p.kind, p.flags)
	}
	var st permitState
	var err error
	if p.rw() {
		st, err = decodeRWLock(lock.Value)
	} else {
		st, err = decodeSemaphoreLock(lock.Value, p.limit)
	}
	switch {
	case err != nil:
		return permitState{}, fmt.Errorf("%w: %s: %w", holdfast.ErrConflict, p.lockKey, err)
	case !p.rw() && st.limit != p.limit:
		return permitState{}, fmt.Errorf("%w: semaphore %s has limit %d in Consul, this client's is %d", holdfast.ErrLimitMismatch, p.name, st.limit, p.limit)
	}
	return st, nil
}

func (p *permits) encode(st permitState) []byte {
	if p.rw() {
		return encodeRWLock(st)
	}
	return encodeSemaphoreLock(st)
}

// waitValue is the value of our contender key while it waits.
func (p *permits) waitValue(exclusive bool) []byte {
	switch {
	case !p.rw():
		return []byte(valWait)
	case exclusive:
		return []byte(valWrite)
	}
	return []byte(valRead)
}

// fits reports whether a contender (exclusive: an RWMutex's writer) may be
// admitted beside the holders of st.
func (p *permits) fits(st permitState, exclusive bool) bool {
	if !p.rw() {
		return len(st.holders) < p.limit
	}
	if exclusive && writerAlone() {
		return len(st.holders) == 0
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
	st   permitState // holders; pruned of dead ones if fresh
	// fresh: lock and the contender keys come from one snapshot (a read of
	// the subtree), so holders whose session holds no key are known dead
	// and were pruned. Otherwise nobody is pruned: a holder admitted after
	// the snapshot of the keys would look dead.
	fresh   bool
	waiters []contender   // holdfast waiters, by CreateIndex
	me      *api.KVPair   // our live contender key, if any
	dead    []*api.KVPair // contender keys without a session
	err     error         // why we must not use the name (ErrConflict)
	foreign bool          // a foreign contender (api.Semaphore) has a live key
}

// parse builds a view from a transaction's results that include a read of
// the subtree "<name>/" (the last answer about a key is the latest).
func (p *permits) parse(results []*api.TxnResult) pview {
	latest := make(map[string]*api.KVPair, len(results))
	var order []string
	for _, r := range results {
		if e := r.KV; e != nil {
			if _, ok := latest[e.Key]; !ok {
				order = append(order, e.Key)
			}
			latest[e.Key] = e
		}
	}
	v := pview{fresh: true}
	live := make(map[string]bool, len(order))
	var keys []*api.KVPair
	for _, k := range order {
		e := latest[k]
		if e.Session != "" {
			live[e.Session] = true // api.Semaphore's rule for a live holder
		}
		if e.Key == p.lockKey {
			v.lock = e
			continue
		}
		rest, ok := strings.CutPrefix(e.Key, p.prefix)
		switch {
		case !ok:
			continue
		case rest == "" || strings.Contains(rest, "/") || strings.HasPrefix(rest, "."):
			v.conflict(fmt.Errorf("%w: %q is under %s: not a %s's key", holdfast.ErrConflict, e.Key, p.prefix, p.kind))
			continue
		case e.Flags != p.flags:
			v.conflict(fmt.Errorf("%w: %s has flags %#x, not a %s contender's %#x", holdfast.ErrConflict, e.Key, e.Flags, p.kind, p.flags))
			continue
		case e.Session == "":
			v.dead = append(v.dead, e)
			continue
		}
		keys = append(keys, e)
	}
	st, err := p.decode(v.lock)
	if err != nil {
		v.conflict(err)
		st = permitState{limit: p.limit, holders: map[string]bool{}}
	}
	for h := range st.holders {
		if prunable(live, h) {
			delete(st.holders, h)
		}
	}
	v.st = st
	for _, e := range keys {
		if e.Key == p.myKey && e.Session == p.s.id {
			v.me = e
		}
		val := string(e.Value)
		c := contender{key: e.Key, session: e.Session, index: e.ModifyIndex, create: e.CreateIndex}
		switch {
		case val == valHeld || val == valHeldNext || val == valDowngraded:
			continue
		case val == valWait && !p.rw(), val == valRead && p.rw():
		case val == valWrite && p.rw():
			c.exclusive = true
		case val == valWait || val == valRead || val == valWrite:
			other := "read-write lock"
			if val == valWait {
				other = "semaphore"
			}
			v.conflict(fmt.Errorf("%w: %s is a holdfast %s's contender, not a %s's", holdfast.ErrConflict, e.Key, other, p.kind))
			continue
		case p.rw():
			v.conflict(fmt.Errorf("%w: %s is a foreign contender: %s is not a read-write lock", holdfast.ErrConflict, e.Key, p.name))
			continue
		default:
			v.foreign = true // a foreign contender (api.Semaphore): never waited for
			continue
		}
		v.waiters = append(v.waiters, c)
	}
	slices.SortFunc(v.waiters, func(x, y contender) int { return cmp.Compare(x.create, y.create) })
	return v
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
	value := p.encode(st)
	if v.lock != nil && string(value) == string(v.lock.Value) {
		// Consul does not move the index of a write that changes nothing:
		// a newline (which JSON ignores) makes the write a change.
		value = append(value, '\n')
	}
	ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: verb, Key: p.lockKey, Index: index, Flags: p.flags, Value: value}})
	for i, w := range in {
		val := valHeld
		if i+1 < len(in) {
			val = valHeldNext
		}
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: w.key, Index: w.index, Flags: p.flags, Value: []byte(val)}})
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

// passOn admits, after a write of ours left permits free, the waiters that
// now fit: those that joined after the view the write was computed from
// and before it landed. Such a waiter found a holdfast waiter ahead of it
// and trusts the write that admits that one to admit it too, or to leave it
// at the head of a full semaphore (then the next release, whose read comes
// after our write, hands it a permit). v is the subtree as our write left
// it. A waiter that joined after our write saw it, and is at the head or
// behind someone whose admission it watches. Best effort: on an error the
// waiters re-read after blockWait.
func (p *permits) passOn(ctx context.Context, v pview) {
	for attempt := 1; attempt <= maxLeaveAttempts && v.err == nil; attempt++ {
		st, in := p.admit(v.st, v.waiters)
		if len(in) == 0 {
			return
		}
		ops := p.writeOps(v, st, in)
		room := p.roomy(st)
		if room {
			ops = append(ops, p.readAfter())
		}
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		resp, err := p.s.txn(rctx, ops)
		cancel()
		var rb *rollback
		switch {
		case err == nil && room:
			v = p.parse(resp.Results) // admitted; more may fit
		case errors.As(err, &rb) && !rb.denied():
			// The lock key or a waiter changed: read again.
			if !sleep(ctx, backoff(attempt)) {
				return
			}
			if v, err = p.read(ctx); err != nil {
				return
			}
		default:
			return
		}
	}
}

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

// backoff is the pause before attempt (from 1) of a release that lost a
// race for the lock key: random, up to 2^attempt ms, so that holders
// releasing at once do not collide again. It is not core.Backoff on
// purpose: a lost race is answered by a fresh read within milliseconds (50
// ms would stall every contended release), and a store error is not
// retried here but by the caller (core.Retry in cleanup, Unlock).
func backoff(attempt int) time.Duration {
	return time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))
}

// leaveMode says what leave does.
type leaveMode int

const (
	leaveRelease   leaveMode = iota // Unlock, or the end of a lost grant
	leaveCleanup                    // after a failed acquisition
	leaveDowngrade                  // RWMutex.Downgrade
)

// permitHold is what a permit's release and Downgrade need.
type permitHold struct {
	p         *permits
	exclusive bool
	free      func() // frees the name in-process; passed to the read grant on Downgrade
}

// leave is a release or a cleanup: it removes us from the holders (handing
// the permit to the waiters that then fit, in queue order) and deletes our
// contender key, in one transaction guarded by our session holding the key
// and CAS on the lock key; if downgrade, it turns our exclusive permit into a
// shared one instead, and returns the new token. It starts from v if given
// (then from reads). A key of ours that is not (or no longer) a holder's is
// deleted by CAS, so that a handoff to us meanwhile is seen and passed on. It
// returns an error wrapping holdfast.ErrNotHeld if our session no longer
// holds the key (nothing then to do: if we were a holder, we are dead and
// will be pruned), and errStale after repeated races.
func (p *permits) leave(ctx context.Context, v *pview, how leaveMode) (uint64, error) {
	downgrade := how == leaveDowngrade
	for attempt := 0; attempt < maxLeaveAttempts; attempt++ {
		if attempt > 0 && !sleep(ctx, backoff(attempt)) {
			return 0, ctx.Err()
		}
		if v == nil || attempt > 0 {
			read := p.read
			if how == leaveCleanup {
				read = p.readOrdered
			}
			r, err := read(ctx)
			if err != nil {
				return 0, err
			}
			v = &r
			hookLeaveRead(p)
		}
		if v.me == nil {
			if how == leaveCleanup {
				return 0, nil // nothing of ours left
			}
			return 0, fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, p.myKey, p.s.id)
		}
		ops := permitReleaseGuard(p.myKey, p.s.id)
		held := len(ops)
		after := false // read the subtree after the writes, and passOn
		_, in := v.st.holders[p.s.id]
		switch {
		case v.err != nil && in:
			// The lock key is not ours to write any more (a foreign value
			// replaced it): never overwrite it; deleting our key makes us a
			// dead holder, pruned by whoever can read the value.
			if downgrade {
				return 0, v.err
			}
			ops = append(ops, kvOp(api.KVDelete, p.myKey))
		case in:
			st := v.st.clone()
			if downgrade {
				st.holders[p.s.id] = false
			} else {
				delete(st.holders, p.s.id)
			}
			st, admitted := p.admit(st, v.waiters)
			if len(st.holders) == 0 && len(v.waiters) == 0 && !v.fresh && attempt+1 < maxLeaveAttempts {
				continue // maybe the last holder: read, to delete the lock key if so
			}
			if len(st.holders) == 0 && len(v.waiters) == 0 && v.lock != nil {
				ops = append(ops, deleteCAS(p.lockKey, v.lock.ModifyIndex)) // nothing left behind
			} else {
				ops = append(ops, p.writeOps(*v, st, admitted)...)
			}
			if downgrade {
				ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: p.myKey, Index: v.me.ModifyIndex, Flags: p.flags, Value: []byte(valDowngraded)}})
			} else {
				ops = append(ops, kvOp(api.KVDelete, p.myKey))
			}
			after = p.roomy(st)
		default:
			if downgrade {
				return 0, fmt.Errorf("%w: %s is no longer counted among the holders of %s", holdfast.ErrNotHeld, p.s.id, p.lockKey)
			}
			ops = append(ops, deleteCAS(p.myKey, v.me.ModifyIndex))
			// A waiter behind us that joined after our read may trust us
			// to admit it: read after the write, and pass the permits on.
			after = v.err == nil
			if others := slices.DeleteFunc(slices.Clone(v.waiters), func(w contender) bool { return w.key == p.myKey }); v.err == nil && len(others) > 0 {
				// A waiter that leaves passes the baton: it admits the
				// waiters that now fit (it may have been the head, with
				// room), and in any case writes the lock key, so that a
				// release based on a read made before the waiters behind
				// us joined fails its CAS and reads again (it would hand
				// the permit to nobody, and the new head, watching its own
				// key, would not know).
				st, admitted := p.admit(v.st, others)
				ops = append(ops, p.writeOps(*v, st, admitted)...)
			}
		}
		n := len(ops)
		if after {
			ops = append(ops, p.readAfter())
		}
		resp, err := p.s.txn(ctx, ops)
		if err == nil && after && len(resp.Results) >= n {
			p.passOn(ctx, p.parse(resp.Results))
		}
		var rb *rollback
		switch {
		case err == nil && downgrade:
			return resp.Results[n-1].KV.ModifyIndex, nil
		case err == nil && how == leaveRelease && !in:
			// A holder's entry is pruned only once its key is gone: the
			// lock key was rewritten or deleted from outside.
			return 0, fmt.Errorf("%w: %s was no longer among the holders in %s", holdfast.ErrNotHeld, p.s.id, p.lockKey)
		case err == nil:
			return 0, nil
		case errors.As(err, &rb) && rb.denied():
			return 0, txnError("release "+p.myKey, rb)
		case rb != nil && rb.failedBefore(held):
			return 0, fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, p.myKey, p.s.id)
		case rb != nil:
			continue // the lock key or a waiter changed: read again
		default:
			return 0, err
		}
	}
	return 0, errStale
}

// grant wraps an admitted contender key in a Grant.
func (p *permits) grant(token uint64, exclusive bool, free func()) (*Grant, error) {
	g := &Grant{s: p.s, prefix: p.prefix, rel: &permitHold{p: p, exclusive: exclusive, free: free}}
	g.base = core.NewGrant(p.s.keeper, p.s.bg, p.myKey, holdfast.Token(token), g.release, free)
	p.s.hold(g)
	if g.Context().Err() != nil {
		return nil, p.s.alive() // the session ended meanwhile; Close releases the key
	}
	return g, nil
}

// release is a permit's release (see releaser): a leave from a read, which
// hands the permit on, or does nothing if our session no longer holds the
// key.
func (h *permitHold) release(ctx context.Context, g *Grant) error {
	_, err := h.p.leave(ctx, nil, leaveRelease)
	if errors.Is(err, holdfast.ErrNotHeld) && errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) {
		h.p.s.checkSoon() // an Unlock found the key taken: look at the others
	}
	return err
}

// drop leaves the holders as the session closes, handing the permit on.
func (h *permitHold) drop(ctx context.Context, _ *Grant) error {
	_, err := h.p.leave(ctx, nil, leaveRelease)
	return err
}

// pacq is one acquisition of a permit in progress.
type pacq struct {
	p         *permits
	exclusive bool
	left      bool // something of ours may be in Consul (see Mutex's acquisition)
	// uncertain: a join or an admission was sent and its outcome is unknown
	// (see sweepLater).
	uncertain bool
}

// acquire runs Lock (try false) or TryLock through p.
func (p *permits) acquire(ctx context.Context, exclusive, try bool) (*Grant, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	s := p.s
	if err := s.alive(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("holdfast/consul: lock %s: %w", p.name, err)
	}
	end, err := s.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	start := time.Now()
	defer s.keeper.Waiting(p.name)()
	wctx, cancel := s.bind(ctx)
	defer cancel()
	a := &pacq{p: p, exclusive: exclusive}
	fail := func(err error) error { return p.fail(ctx, wctx, err) }
	var free func()
	if try {
		var ok bool
		if free, ok = s.names.TryAcquire(p.name); !ok {
			return nil, fmt.Errorf("%w: %s is being taken through this session", holdfast.ErrLocked, p.name)
		}
	} else if free, err = s.names.Acquire(wctx, p.name); err != nil {
		return nil, fail(err)
	}
	var token uint64
	if try {
		token, err = a.try(wctx)
	} else {
		token, err = a.run(wctx)
	}
	if err != nil {
		if !a.left {
			free()
			return nil, fail(err)
		}
		done := s.cleanUp(p.leftover(), free)
		if a.uncertain {
			p.sweepLater()
		}
		grace := time.NewTimer(cleanupGrace)
		defer grace.Stop()
		select {
		case <-done:
		case <-wctx.Done():
			select {
			case <-done:
			case <-grace.C:
			}
		}
		return nil, fail(err)
	}
	g, err := p.grant(token, exclusive, free)
	if err == nil {
		g.base.Observed(p.name, start)
	}
	return g, err
}

// leftover is the cleanup of what a failed acquisition or Downgrade may
// have left: our key, and our place among the holders.
func (p *permits) leftover() leftover {
	return leftover{name: p.name, fn: func(ctx context.Context) error {
		_, err := p.leave(ctx, nil, leaveCleanup)
		if errors.Is(err, holdfast.ErrNotHeld) {
			return nil // our session no longer holds the key: nothing to remove
		}
		return err
	}}
}

// sweepDelays are when, after a failed acquisition whose join or admission
// had an unknown outcome, the session looks again for a key of ours.
var sweepDelays = []time.Duration{250 * time.Millisecond, time.Second, 3 * time.Second, 10 * time.Second}

// sweepLater removes a late-landing join (or admission) of ours: a request
// abandoned by its caller may still reach the server after the cleanup has
// read the keys (on a loaded server, seen in tests), and would leave a
// waiter that nobody waits behind, and then a permit handed to nobody. A
// background task of the session looks again a few times over 15 s: each
// time, once no acquisition, cleanup or grant of ours uses the name (it
// takes the in-process name slot), it runs the cleanup once more. An
// acquisition of ours that uses the name meanwhile replaces any leftover
// key with its own join.
func (p *permits) sweepLater() {
	p.s.abandon(p.leftover()) // and Close sweeps once more, for a join that lands later still
	p.s.bg.Go(func(ctx context.Context) {
		for _, d := range sweepDelays {
			if !sleep(ctx, d) {
				return
			}
			free, err := p.s.names.Acquire(ctx, p.name)
			if err != nil {
				return
			}
			actx, cancel := context.WithTimeout(ctx, core.AttemptTimeout)
			_, _ = p.leave(actx, nil, leaveCleanup)
			cancel()
			free()
		}
	})
}

// fail picks the error a failed acquisition returns (see acquisition.fail):
// ctx is the caller's, wctx the one the acquisition ran under (it ends with
// ctx or with the session).
func (p *permits) fail(ctx, wctx context.Context, err error) error {
	if wctx.Err() == nil {
		return err
	}
	if serr := p.s.alive(); serr != nil {
		return serr
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("holdfast/consul: lock %s: %w", p.name, cerr)
	}
	return err
}

// try is TryLock: one read; if the permit is free and nobody waits, one
// transaction that creates our key already admitted and adds us to the lock
// key by CAS. It writes nothing otherwise.
func (a *pacq) try(ctx context.Context) (uint64, error) {
	p := a.p
	v, err := p.read(ctx)
	if err == nil {
		hookTryRead(p)
	}
	switch {
	case err != nil:
		return 0, err
	case v.err != nil:
		return 0, v.err
	case len(v.waiters) > 0 || !p.fits(v.st, a.exclusive):
		return 0, fmt.Errorf("%w: %s has no free permit, or contenders wait for one", holdfast.ErrLocked, p.name)
	}
	st := v.st.clone()
	delete(st.holders, p.s.id)
	st.holders[p.s.id] = a.exclusive
	ops := p.writeOps(v, st, nil)
	ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: p.myKey, Session: p.s.id, Flags: p.flags, Value: []byte(valHeld)}})
	return a.admitTxn(ctx, ops, len(ops)-1, true, p.roomy(st))
}

// admitTxn sends ops, which write st to the lock key (their first operation,
// admitting in) and put our key in its held state (operation mine), and
// returns the token. A race (the lock key or a waiter changed) is token 0
// with no error, or ErrLocked if try. If room (st leaves a permit free), the
// transaction reads the subtree after its writes, and the permits are
// passed on to the waiters that joined meanwhile (see passOn).
func (a *pacq) admitTxn(ctx context.Context, ops api.TxnOps, mine int, try, room bool) (uint64, error) {
	p := a.p
	if room {
		ops = append(ops, p.readAfter())
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	a.left = true
	resp, err := p.s.txn(rctx, ops)
	var rb *rollback
	switch {
	case err == nil:
	case errors.As(err, &rb) && rb.denied():
		return 0, txnError("acquire a permit of "+p.name, rb)
	case rb != nil && (rb.sessionGone() || rb.lockDelayed()):
		return 0, p.s.ended()
	case rb != nil && try:
		a.left = false
		return 0, fmt.Errorf("%w: %s changed meanwhile", holdfast.ErrLocked, p.name)
	case rb != nil:
		return 0, nil
	default:
		a.uncertain = true
		return 0, err
	}
	if len(resp.Results) < len(ops) {
		return 0, errors.New("holdfast/consul: acquire: Consul's answer lacks results")
	}
	ours := resp.Results[mine].KV
	if ours == nil || ours.Key != p.myKey {
		return 0, errors.New("holdfast/consul: acquire: Consul's answer has no entry for our key")
	}
	if room {
		p.passOn(ctx, p.parse(resp.Results))
	}
	return ours.ModifyIndex, nil
}

// join creates our contender key (replacing a leftover of ours, so that our
// place is at the back) and reads the subtree, in one transaction.
func (a *pacq) join(ctx context.Context) (pview, error) {
	p := a.p
	ops := api.TxnOps{
		kvOp(api.KVDelete, p.myKey),
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: p.myKey, Session: p.s.id, Flags: p.flags, Value: p.waitValue(a.exclusive)}},
		kvOp(api.KVGetTree, p.prefix),
	}
	a.left = true
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := p.s.txn(rctx, ops)
	var rb *rollback
	switch {
	case err == nil:
	case errors.As(err, &rb) && rb.denied():
		return pview{}, txnError("join "+p.name, rb)
	case rb != nil && (rb.sessionGone() || rb.lockDelayed()):
		return pview{}, p.s.ended()
	case rb != nil:
		return pview{}, txnError("join "+p.name, rb)
	default:
		a.uncertain = true
		return pview{}, err
	}
	return p.parse(resp.Results), nil
}

// run is Lock's algorithm (see Semaphore).
func (a *pacq) run(ctx context.Context) (uint64, error) {
	p := a.p
	v, err := a.join(ctx)
	if err != nil {
		return 0, err
	}
	joins := 1
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if v.err != nil {
			return 0, v.err
		}
		if len(v.dead) > 0 {
			a.dropDead(ctx, v.dead)
			v.dead = nil
		}
		if v.admitted(p) {
			return v.me.ModifyIndex, nil
		}
		if v.me == nil || !slices.ContainsFunc(v.waiters, func(w contender) bool { return w.key == p.myKey }) {
			// Our key vanished, lost its session, or was marked held
			// without our session being a holder: join again.
			if joins++; joins > 3 { // in a row
				return 0, fmt.Errorf("holdfast/consul: %s: our contender key keeps vanishing", p.name)
			}
			if v, err = a.join(ctx); err != nil {
				return 0, err
			}
			continue
		}
		joins = 0
		if ahead := v.ahead(); len(ahead) > 0 && !v.foreign {
			// Holdfast waiters are ahead of us: the write that admits
			// the last of them admits us too if we fit, or passes the
			// permit on to us after it (passOn: it may have been computed
			// before we joined); after it, every holdfast release that
			// frees a permit hands it to us, marking our key. Watch our
			// own key (re-reading every blockWait, which prunes dead
			// holders).
			if token, got, err := a.awaitHandoff(ctx, v.me); err != nil || got {
				return token, err
			}
		} else if len(ahead) > 0 {
			// With foreign contenders about (whose releases hand nothing
			// over), wait for the waiter just ahead of us to change: admitted
			// (its key is marked held by the write that admitted it), gone,
			// or dead.
			pred := ahead[len(ahead)-1]
			next, err := a.watch(ctx, pred.key, pred.index, false)
			if err != nil {
				return 0, err
			}
			if next != nil && next.Session == pred.session && next.ModifyIndex > pred.index {
				switch string(next.Value) {
				case valHeldNext: // admitted with us: our token is that write's
					return next.ModifyIndex, nil
				case valHeld: // we are the head now: wait on the lock key
					lock, err := a.watch(ctx, p.lockKey, next.ModifyIndex, true)
					if err != nil {
						return 0, err
					}
					if lock != nil {
						v.lock, v.fresh = lock, false
						v.waiters = slices.DeleteFunc(v.waiters, func(w contender) bool { return w.create < v.me.CreateIndex })
						if token, got, err := a.atHead(ctx, v); err != nil || got {
							return token, err
						}
					}
				}
			}
		} else if token, got, err := a.atHead(ctx, v); err != nil || got {
			return token, err
		}
		if v, err = p.read(ctx); err != nil {
			return 0, err
		}
	}
}

// atHead is the head of the queue's wait: while the lock key has no room
// for us, wait for it to change (at most blockWait, then a read prunes dead
// holders), and admit us (with the waiters behind us that fit) once it has.
// It reports whether we got in; if not, the caller reads again.
func (a *pacq) atHead(ctx context.Context, v pview) (uint64, bool, error) {
	for {
		token, got, full, err := a.tryHead(ctx, v)
		if err != nil || got || !full || v.lock == nil {
			return token, got, err
		}
		if v.lock.ModifyIndex > v.me.CreateIndex && !v.foreign {
			return a.awaitHandoff(ctx, v.me)
		}
		lock, err := a.watch(ctx, a.p.lockKey, v.lock.ModifyIndex, true)
		if err != nil || lock == nil {
			return 0, false, err
		}
		v.lock, v.fresh = lock, false
	}
}

// awaitHandoff is the wait of the head of the queue once every holdfast
// release that frees a permit is known to hand it to us (the lock key was
// written after we joined, and no foreign contender is about, whose release
// would not): it watches our own key, which the handoff marks held with the
// token as its index. It reports whether we got in; if not (no change within
// blockWait, so that dead holders are pruned, or another change), the
// caller reads again.
func (a *pacq) awaitHandoff(ctx context.Context, me *api.KVPair) (uint64, bool, error) {
	pair, err := a.watch(ctx, a.p.myKey, me.ModifyIndex, true)
	if err != nil || pair == nil || pair.Session != a.p.s.id {
		return 0, false, err
	}
	if v := string(pair.Value); v == valHeld || v == valHeldNext {
		return pair.ModifyIndex, true, nil
	}
	return 0, false, nil
}

// tryHead admits us, at the head of the queue, if the lock key v.lock has
// room, with the waiters behind us that fit too. If v is not fresh (the lock
// key comes from a watch), nobody is pruned, and finding our session among
// the holders means a handoff to us (or a stale entry): not got, read again.
// full reports that there is no room for us.
func (a *pacq) tryHead(ctx context.Context, v pview) (token uint64, got, full bool, err error) {
	p := a.p
	st := v.st
	if !v.fresh {
		if st, err = p.decode(v.lock); err != nil {
			return 0, false, false, err
		}
		if _, in := st.holders[p.s.id]; in {
			return 0, false, false, nil
		}
	}
	queue := []contender{{key: p.myKey, session: p.s.id, index: v.me.ModifyIndex, create: v.me.CreateIndex, exclusive: a.exclusive}}
	for _, w := range v.waiters {
		if w.create > v.me.CreateIndex {
			queue = append(queue, w)
		}
	}
	st, in := p.admit(st, queue)
	if len(in) == 0 {
		return 0, false, true, nil
	}
	token, err = a.admitTxn(ctx, p.writeOps(v, st, in), 1, false, p.roomy(st))
	return token, token != 0, false, err
}

// watch blocks until key's ModifyIndex is no longer index (it changed or is
// gone) and returns the key as it then is (nil if gone). If bounded, it
// returns nil after blockWait without a change too (see Session.watchKey).
func (a *pacq) watch(ctx context.Context, key string, index uint64, bounded bool) (*api.KVPair, error) {
	var bound time.Duration
	if bounded {
		bound = blockWait
	}
	return a.p.s.watchKey(ctx, key, index, bound)
}

// dropDead deletes contender keys without a session, if unchanged; best
// effort (see Session.dropDead).
func (a *pacq) dropDead(ctx context.Context, dead []*api.KVPair) { a.p.s.dropDead(ctx, dead) }
