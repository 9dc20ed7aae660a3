package consul

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// The keys of Semaphore and RWMutex and what a read of them says (steps:
// docs/DESIGN.md, "Consul semaphore and read-write lock").

// RWMutexFlagValue is the flags value of an RWMutex's keys ("holdrwlk" in
// ASCII); other kinds of lock refuse a lock key with these flags.
const RWMutexFlagValue uint64 = 0x686f6c6472776c6b

// Values of holdfast's contender keys: the mode it waits for, then the
// admitted ones. Other values are foreign (api.Semaphore, `consul lock -n`).
const (
	valWait       = "holdfast"                  // a Semaphore's waiter
	valRead       = "holdfast read"             // an RWMutex's waiting reader
	valWrite      = "holdfast write"            // an RWMutex's waiting writer
	valHeld       = "holdfast held"             // set by the write that admits it
	valHeldNext   = "holdfast held+next"        // that write admitted the next waiter too
	valDowngraded = "holdfast held, downgraded" // keeps the write grant's token
)

// permitKind is what tells a Semaphore's keys from an RWMutex's.
type permitKind struct {
	what           string // for errors
	flags          uint64 // of the lock key and the contender keys
	shared, writer string // a waiting contender's value
	foreignOK      bool   // foreign contenders (api.Semaphore's) may share the name
	decode         func(value []byte, limit int) (permitState, error)
}

var (
	semaphoreKind = &permitKind{"semaphore", api.SemaphoreFlagValue, valWait, valWait, true, decodeSemaphoreLock}
	rwKind        = &permitKind{"read-write lock", RWMutexFlagValue, valRead, valWrite, false, decodeRWLock}
	rwMode        = map[bool]string{false: "read", true: "write"} // an RWMutex holder's, by exclusive
)

// permits is a Semaphore's (limit > 0) or an RWMutex's (limit 0) keys.
type permits struct {
	*permitKind
	s                            *Session
	name, prefix, lockKey, myKey string // "<name>", "<name>/", "<name>/.lock", "<name>/<session ID>"
	limit                        int
}

// newPermits checks the arguments common to NewSemaphore and NewRWMutex.
func newPermits(s *Session, name string, limit int) (*permits, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := cmp.Or(holdfast.ValidateName(name), s.alive()); err != nil {
		return nil, err
	}
	k := semaphoreKind
	if limit == 0 {
		k = rwKind
	}
	return &permits{permitKind: k, s: s, name: name, prefix: name + "/", lockKey: name + lockSuffix, myKey: name + "/" + s.id, limit: limit}, nil
}

// fits reports whether a contender (exclusive: a writer) may be admitted
// beside the holders of st: within the limit, and no writer with anyone.
func (p *permits) fits(st permitState, exclusive bool) bool {
	n, writerIn := len(st.holders), slices.Contains(slices.Collect(maps.Values(st.holders)), true)
	return !(p.limit > 0 && n >= p.limit) && !(exclusive && writerAlone() && n > 0) && !writerIn
}

// contender is a holdfast contender key that waits.
type contender struct {
	key, session string
	index        uint64 // ModifyIndex
	exclusive    bool
}

// pview is what one read of the subtree "<name>/" says (step 1).
type pview struct {
	lock    *api.KVPair   // nil if absent
	st      permitState   // the holders whose session holds a key read
	waiters []contender   // holdfast waiters of our kind, by CreateIndex (the queue order)
	pos     int           // our place among waiters; -1: we do not wait
	me      *api.KVPair   // our contender key, if our session holds it
	dead    []*api.KVPair // Semaphore and RWMutex contender keys held by no session
	err     error         // why we must not use the name (ErrConflict)
	foreign bool          // a foreign contender (api.Semaphore's) is live
	index   uint64        // the highest ModifyIndex read
}

// latest returns the keys results answer about, each as last answered.
func latest(results []*api.TxnResult) []*api.KVPair {
	last := make(map[string]*api.KVPair, len(results))
	for _, r := range results {
		if r.KV != nil {
			last[r.KV.Key] = r.KV
		}
	}
	return slices.Collect(maps.Values(last))
}

// parse builds a view from the keys of the subtree, read at once.
func (p *permits) parse(kvs []*api.KVPair) pview {
	v := pview{pos: -1}
	live := make(map[string]bool, len(kvs))
	slices.SortFunc(kvs, func(x, y *api.KVPair) int { return cmp.Compare(x.CreateIndex, y.CreateIndex) })
	for _, e := range kvs {
		v.index = max(v.index, e.ModifyIndex)
		live[e.Session] = e.Session != "" // api.Semaphore's rule for a live holder
		if e.Key == p.myKey && e.Session == p.s.id && e.Flags == p.flags {
			v.me = e
		}
		if e.Key == p.lockKey {
			v.lock = e
		} else {
			p.classify(&v, e)
		}
	}
	st, err := p.holders(v.lock, kvs)
	v.st, v.err = st, cmp.Or(err, v.err)
	maps.DeleteFunc(st.holders, func(h string, _ bool) bool { return prunable(live, h) })
	if v.me != nil {
		v.pos = slices.IndexFunc(v.waiters, func(w contender) bool { return w.key == p.myKey })
	}
	return v
}

// holders returns the holders in lock (none if absent or a dead lock of
// another kind, which our admission's CAS replaces), or an error wrapping
// holdfast.ErrConflict: a live one, a value we cannot decode, another limit.
func (p *permits) holders(lock *api.KVPair, kvs []*api.KVPair) (permitState, error) {
	none := permitState{limit: p.limit, holders: map[string]bool{}}
	if lock == nil {
		return none, nil
	}
	if lock.Flags != p.flags {
		return none, liveUnder(kvs, lock, func(e *api.KVPair) bool { return e.Flags == p.flags }, "a holdfast "+p.what)
	}
	st, err := p.decode(lock.Value, p.limit)
	switch {
	case err != nil:
		return none, fmt.Errorf("%w: %s: %w", holdfast.ErrConflict, p.lockKey, err)
	case st.limit != p.limit && slices.ContainsFunc(kvs, func(e *api.KVPair) bool { return e.Session != "" }):
		return none, fmt.Errorf("%w: semaphore %s has limit %d in Consul, this client's is %d", holdfast.ErrLimitMismatch, p.name, st.limit, p.limit)
	case st.limit != p.limit: // as api.Semaphore's, the limit stays with the key
		return none, fmt.Errorf("%w: semaphore %s has limit %d in Consul, this client's is %d; no live session holds or waits for it: delete %s to use another limit", holdfast.ErrLimitMismatch, p.name, st.limit, p.limit, p.lockKey)
	}
	return st, nil
}

// classify notes in v the key e, other than the lock key: a waiter of our
// kind, a foreign contender, a dead contender key, or a conflict. Other
// keys held by no session (plain data, a dead Mutex's tail) are left alone.
func (p *permits) classify(v *pview, e *api.KVPair) {
	rest := strings.TrimPrefix(e.Key, p.prefix)
	shaped := rest != "" && !strings.Contains(rest, "/") && rest[0] != '.'
	val := string(e.Value)
	switch {
	case e.Session == "":
		if shaped && (e.Flags == api.SemaphoreFlagValue || e.Flags == RWMutexFlagValue) {
			v.dead = append(v.dead, e)
		}
	case !shaped:
		v.conflict("%q is under %s: not a %s's key", e.Key, p.prefix, p.what)
	case e.Flags != p.flags:
		v.conflict("%s has flags %#x, not a %s contender's %#x", e.Key, e.Flags, p.what, p.flags)
	case held(val):
	case val == p.shared || val == p.writer:
		v.waiters = append(v.waiters, contender{e.Key, e.Session, e.ModifyIndex, val != p.shared})
	case val == valWait || val == valRead || val == valWrite:
		v.conflict("%s is another holdfast primitive's contender, not a %s's", e.Key, p.what)
	case !p.foreignOK:
		v.conflict("%s is a foreign contender: %s is not a %s", e.Key, p.name, p.what)
	default:
		v.foreign = true // never waited for
	}
}

func (v *pview) conflict(format string, args ...any) {
	if v.err == nil {
		v.err = fmt.Errorf("%w: "+format, append([]any{holdfast.ErrConflict}, args...)...)
	}
}

func held(val string) bool { return val == valHeld || val == valHeldNext || val == valDowngraded }

// admitted reports whether our key holds a permit in v.
func (v pview) admitted(p *permits) bool {
	_, in := v.st.holders[p.s.id]
	return in && v.me != nil && held(string(v.me.Value))
}

// admit admits the waiters of ws in order while they fit beside the holders
// of st, and returns the new state and whom it admitted.
func (p *permits) admit(st permitState, ws []contender) (permitState, []contender) {
	st = st.clone()
	for i, w := range ws {
		delete(st.holders, w.session) // a stale entry of a waiting session counts for nothing
		if !p.fits(st, w.exclusive) {
			return st, ws[:i]
		}
		st.holders[w.session] = w.exclusive
	}
	return st, ws
}

// writeOps store st in the lock key (CAS at its index in v) and mark the
// keys of the waiters in admitted: this write's index is their token.
func (p *permits) writeOps(v pview, st permitState, in []contender) api.TxnOps {
	var index uint64
	value := encodeLock(st)
	if v.lock != nil {
		index = v.lock.ModifyIndex
		if string(value) == string(v.lock.Value) {
			value = append(value, '\n') // a change, to move the index; JSON ignores it
		}
	}
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: permitCAS(), Key: p.lockKey, Index: index, Flags: p.flags, Value: value}}}
	for i, w := range in {
		val := valHeld
		if i+1 < len(in) {
			val = valHeldNext
		}
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: w.key, Index: w.index, Flags: p.flags, Value: []byte(val)}})
	}
	return ops
}

// roomy reports whether st leaves a permit (a read grant) free.
func (p *permits) roomy(st permitState) bool { return p.fits(st, false) }

// read returns the subtree; ordered, after the writes sent before it (a
// delete of a key that never exists makes the read a write), so that a
// cleanup sees an abandoned join or admission of ours.
func (p *permits) read(ctx context.Context, ordered bool) (pview, error) {
	ops := api.TxnOps{kvOp(api.KVGetTree, p.prefix)}
	if ordered {
		ops = append(api.TxnOps{kvOp(api.KVDelete, p.myKey+"/.ordered")}, ops...)
	}
	resp, err := p.write(ctx, ops, false)
	if err != nil {
		return pview{}, err
	}
	return p.parse(latest(resp.Results)), nil
}

// write sends ops. If after, the transaction also reads the subtree as its
// writes left it, and the waiters that then fit are admitted (passOn).
func (p *permits) write(ctx context.Context, ops api.TxnOps, after bool) (*api.TxnResponse, error) {
	if after {
		ops = append(ops, kvOp(api.KVGetTree, p.prefix))
	}
	resp, err := p.s.txn(ctx, ops)
	if err == nil && after {
		p.passOn(ctx, p.parse(latest(resp.Results)))
	}
	return resp, err
}

// permitState is the content of the lock key: who holds a permit.
type permitState struct {
	limit   int             // a Semaphore's limit; 0 for an RWMutex
	holders map[string]bool // by session ID; true: exclusive (an RWMutex's writer)
}

func (st permitState) clone() permitState { return permitState{st.limit, maps.Clone(st.holders)} }

// decodeSemaphoreLock decodes api.Semaphore's lock value as it does (every
// name in Holders holds a permit); a limit below 1 is an error.
func decodeSemaphoreLock(value []byte, limit int) (permitState, error) {
	st := permitState{limit: limit, holders: map[string]bool{}}
	var l struct {
		Limit   int
		Holders map[string]bool
	}
	if len(value) == 0 {
		return st, nil
	} else if err := json.Unmarshal(value, &l); err != nil {
		return permitState{}, fmt.Errorf("not a semaphore's JSON value: %w", err)
	}
	if st.limit = l.Limit; l.Limit < 1 {
		return permitState{}, fmt.Errorf("semaphore limit %d", l.Limit)
	}
	for h := range l.Holders {
		st.holders[h] = false
	}
	return st, nil
}

// decodeRWLock decodes {"Holders":{"<session>":"read"|"write"}}, an
// RWMutex's lock value (it has no limit); a writer beside anyone is an error.
func decodeRWLock(value []byte, _ int) (permitState, error) {
	st := permitState{holders: map[string]bool{}}
	var l struct{ Holders map[string]string }
	if len(value) == 0 {
		return st, nil
	} else if err := json.Unmarshal(value, &l); err != nil {
		return permitState{}, fmt.Errorf("not a read-write lock's JSON value: %w", err)
	}
	for h, mode := range l.Holders {
		if mode != "read" && mode != "write" {
			return permitState{}, fmt.Errorf("holder %q has mode %q", h, mode)
		}
		st.holders[h] = mode == "write"
		if st.holders[h] && len(l.Holders) > 1 {
			return permitState{}, fmt.Errorf("a writer and %d other holders", len(l.Holders)-1)
		}
	}
	return st, nil
}

// encodeLock is the inverse of the decoders: api.Semaphore's value if
// st has a limit, else an RWMutex's.
func encodeLock(st permitState) []byte {
	l := struct {
		Limit   int `json:",omitempty"`
		Holders map[string]any
	}{st.limit, make(map[string]any, len(st.holders))}
	for h, x := range st.holders {
		l.Holders[h] = true // api.Semaphore's
		if st.limit == 0 {
			l.Holders[h] = rwMode[x]
		}
	}
	b, _ := json.Marshal(l) // cannot fail
	return b
}
