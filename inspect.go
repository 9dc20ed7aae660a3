package holdfast

import "time"

// Kind is the kind of primitive whose keys lie under a name, as a backend's
// Inspect reads it from the keys.
type Kind string

// Kinds of primitives. KindUnknown is the kind of a name with no key that
// says (a free lock or election leaves no key behind).
const (
	KindUnknown   Kind = ""
	KindLock      Kind = "lock"
	KindSemaphore Kind = "semaphore"
	KindRWMutex   Kind = "rwmutex"
	KindElection  Kind = "election"
	KindClaim     Kind = "claim" // a once-per-period claim (etcd.Once, consul.Once)
)

// Origin says which client wrote a contender's key.
type Origin string

// Origins. OriginUnknown is for keys that holdfast and the native clients
// write alike (an election's candidates: the value is the proposal on both).
const (
	OriginUnknown  Origin = ""
	OriginHoldfast Origin = "holdfast"
	// OriginNative: etcdctl lock, concurrency.Mutex, recipe.RWMutex,
	// api.Lock, api.Semaphore, consul lock.
	OriginNative Origin = "native"
)

// State is what the store holds of a name, as the backends' Inspect
// functions read it in one consistent read, writing nothing.
type State struct {
	Name string
	Kind Kind
	// Limit is a semaphore's limit (0 for the other kinds).
	Limit int
	// Period is a claim's last period claimed and PeriodToken the token
	// of that claim (zero for the other kinds). A claim's holder, if any,
	// is the run of that period, still marked as running.
	Period      time.Time
	PeriodToken Token
	// Index is the store's revision (etcd) or index (Consul) of the read:
	// the state is as of this index.
	Index uint64
	// Holders hold the name now (an election's leader, a semaphore's or a
	// read lock's holders), in order of their grants.
	Holders []Contender
	// Waiters wait for it, in the order the store will serve them.
	Waiters []Contender
	// Other are the keys under "<name>/" that are no contender's: keys of
	// longer names ("<name>/b/..."), or of another kind of primitive that
	// conflicts with the one found. holdfast's own bookkeeping keys (Consul's
	// queue and tail keys, etcd's downgrade marker) are not listed.
	Other []string
}

// Contender is one holder or waiter of a name.
type Contender struct {
	// Key is the contender's key: on etcd its own key; on Consul a lock
	// holder's lock key, a lock waiter's queue key, or a permit's contender
	// key.
	Key string
	// Token is a holder's fencing token (an election's term); 0 for
	// waiters, and for holders whose token holdfast cannot read (a native
	// semaphore holder on Consul).
	Token Token
	// Mode is "read" or "write" for a read-write lock, else "".
	Mode string
	// Session is the etcd lease ID in hex, or the Consul session ID.
	Session string
	// TTL is the session's TTL as the store granted it; 0 if unknown.
	TTL time.Duration
	// Left is the time left before the store may expire the session (etcd);
	// -1 when the store does not say (Consul) or its lookup failed.
	Left time.Duration
	// LockDelay is the Consul session's lock-delay (0 on etcd).
	LockDelay time.Duration
	// Value is the value as the user wrote it (an election's proposal, a
	// native lock's value); nil for holdfast's own bookkeeping values.
	Value []byte
	// Origin says whether holdfast or a native client wrote the key.
	Origin Origin
}
