package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/leader"
)

// Backend describes a store to the suite.
type Backend struct {
	// NewLocker returns a Locker for name on a new session of its own, with
	// a client of its own, as a separate process would have, and the faults
	// that can be injected around that session. Everything it creates is
	// cleaned up with t.
	NewLocker func(t *testing.T, name string, opts ...holdfast.LockOption) (holdfast.Locker, Faults)

	// Keys lists every key under name + "/" (full keys, as Grant.Key
	// returns them), read through an independent client, sorted.
	Keys func(t *testing.T, name string) []string

	// Delete deletes key through an independent client, as an operator
	// would (etcdctl del, consul kv delete).
	Delete func(t *testing.T, key string)

	// TTL and Margin are the session TTL and safety margin of every
	// session NewLocker makes: a grant's Deadline must never be later than
	// TTL - Margin after the moment it is read.
	TTL, Margin time.Duration

	// LossNotice bounds how long a grant may take to see its context
	// cancelled after Faults.Kill returns, or after Delete of its key.
	LossNotice time.Duration

	// OpTimeout bounds every Lock, TryLock and Unlock that the suite
	// expects to succeed, and every takeover after a holder's session
	// ended (which includes the store's own expiry of a session cut off
	// from it, and any Consul lock-delay). Zero means 30 s.
	OpTimeout time.Duration

	// NewSemaphore, if set, returns a counting semaphore called name that
	// admits limit holders at once, on a new session of its own (one permit
	// per session, as for NewLocker), with opts, and its faults. Its grants
	// are permits. The Semaphore* properties run only if it is set.
	NewSemaphore func(t *testing.T, name string, limit int, opts ...holdfast.LockOption) (holdfast.Locker, Faults)

	// NewRWMutex, if set, returns a read-write lock called name on a new
	// session of its own, and its faults. The RW* properties run only if
	// it is set.
	NewRWMutex func(t *testing.T, name string) (RWLocker, Faults)

	// TryNewRWMutex, if set, calls the backend's read-write lock
	// constructor for name with opts, on a new session of its own, and
	// returns what it returns. RWReentrancy runs only if it is set.
	TryNewRWMutex func(t *testing.T, name string, opts ...holdfast.LockOption) (RWLocker, error)

	// NewElection, if set, returns a candidate in the election called name
	// on a new session of its own, and its faults; a leadership grant's
	// Unlock resigns. The Election* properties run only if it is set.
	NewElection func(t *testing.T, name string) (leader.Candidate[holdfast.Grant], Faults)

	// ObserveAll says that Observe delivers every leader, in order, even to
	// a slow reader (etcd). Without it (Consul), Observe may skip to the
	// latest state, and the suite checks only that what it delivers is in
	// order and ends with the latest state.
	ObserveAll bool

	// NewClaimer, if set, returns a once-per-period claim called name on
	// schedule sched, on a new session of its own, and its faults. The
	// Claim* properties run only if it is set, with ClaimSchedule (zero:
	// every 4 s, AtLeast 1 s, AtMost 2 s).
	NewClaimer    func(t *testing.T, name string, sched holdfast.Schedule) (Claimer, Faults)
	ClaimSchedule holdfast.Schedule
	// ClaimFree bounds how long past AtMost (a crashed holder) or past
	// AtLeast (a released claim) the store may keep a claim: lease or
	// session expiry granularity.
	ClaimFree time.Duration

	// NewMultiLocker, if set, returns a function that makes multi-name
	// locks (of the names given, in any order) on one new session of its
	// own, and that session's faults. The Multi* properties run only if it
	// is set; MultiNoDeadlock runs for MultiRun (zero: 5 s).
	NewMultiLocker func(t *testing.T) (func(names ...string) (MultiLocker, error), Faults)
	MultiRun       time.Duration
}

// RWLocker is a read-write lock as the suite drives it: Lock and TryLock
// take the write lock, RLock and TryRLock a read lock. Readers share the
// lock with each other; a writer holds it alone.
type RWLocker interface {
	holdfast.Locker
	// RLock waits for a read grant, as Lock does for a write grant.
	RLock(ctx context.Context) (holdfast.Grant, error)
	// TryRLock takes a read grant if no writer holds the lock or waits for
	// it, and returns an error wrapping holdfast.ErrLocked at once
	// otherwise.
	TryRLock(ctx context.Context) (holdfast.Grant, error)
	// Downgrade turns w, a write grant of this lock, into a read grant
	// with w's key and token, letting in the readers queued at the head
	// and no writer. w ends (cause holdfast.ErrReleased) whether or not it
	// succeeds; if w is not held, the error wraps holdfast.ErrNotHeld.
	Downgrade(ctx context.Context, w holdfast.Grant) (holdfast.Grant, error)
}

// Faults act on one locker's session and its connection to the store.
type Faults struct {
	// Kill ends the session in the store from outside (etcd: revoke its
	// lease; Consul: destroy the session), the way the store ends a
	// crashed holder's session.
	Kill func()
	// Cut drops all traffic between the locker's client and the store, in
	// both directions, as a network partition would, until Mend.
	Cut func()
	// Freeze holds all traffic between the locker's client and the store
	// until Mend, as a frozen store (or a paused network) would: requests
	// get no answer, and connections stay open.
	Freeze func()
	// Mend undoes Cut and Freeze.
	Mend func()
	// Close closes the locker's session (Session.Close).
	Close func()
	// Requests returns how many requests the locker's client has sent to
	// the store so far, long polls that merely wait for a change left out
	// (etcd: unary RPCs, not watch streams; Consul: HTTP requests other
	// than blocking queries), so that the suite can see which waiters a
	// release wakes.
	Requests func() int64
}

const (
	defaultOpTimeout = 30 * time.Second
	// keyWait bounds how long a waiter's queue key may take to appear.
	keyWait = 10 * time.Second
	// settle bounds how long keys may take to disappear from a read
	// through another client after the last Unlock or a kill, and how
	// long a release left to the background may take once the store
	// answers again (a retry pause of up to 1 s plus a 2 s attempt).
	settle = 5 * time.Second
	// slack is how long a call may take to return once its context is done
	// (or it was told to return "promptly").
	slack = 3 * time.Second
	// promptly bounds how long a call may take to return once its context
	// ended, or once its session ended, even with the store frozen: "within
	// milliseconds", with room for a loaded 2-core machine.
	promptly = 250 * time.Millisecond
	// admitWithin bounds how long PromptAdmission lets a contender that
	// fits wait for its grant: a few requests, with room for a loaded
	// 2-core machine and a 3-member cluster under -race (264 ms was seen
	// there), and well under what a late admission waits for (a holder's
	// release, or Consul's 5 s re-read).
	admitWithin = time.Second
	// poll is the interval between two reads of Keys while waiting.
	poll = 20 * time.Millisecond
)

// subtest is one property of the suite.
type subtest struct {
	name string
	fn   func(*suite)
	// needs names the optional Backend constructor the property drives
	// ("" for NewLocker, which every backend has).
	needs string
}

// Optional Backend constructors, as subtest.needs names them.
const (
	needsSemaphore = "NewSemaphore"
	needsRWMutex   = "NewRWMutex"
	needsRWOptions = "TryNewRWMutex"
	needsElection  = "NewElection"
	needsClaimer   = "NewClaimer"
	needsMulti     = "NewMultiLocker"
)

// subtests is the suite, in the order Run runs it.
var subtests = []subtest{
	{"MutualExclusion", testMutualExclusion, ""},
	{"FIFO", testFIFO, ""},
	{"NoHerd", testNoHerd, ""},
	{"TryLock", testTryLock, ""},
	{"CancelCleanup", testCancelCleanup, ""},
	{"MonotonicTokens", testMonotonicTokens, ""},
	{"LossNotice", testLossNotice, ""},
	{"ToldBeforeNextGrant", testToldBeforeNextGrant, ""},
	{"DeletedKey", testDeletedKey, ""},
	{"SessionClose", testSessionClose, ""},
	{"DoubleUnlock", testDoubleUnlock, ""},
	{"Reentrancy", testReentrancy, ""},
	{"ContextWhileWaiting", testContextWhileWaiting, ""},
	{"BoundedLock", testBoundedLock, ""},
	{"BoundedUnlock", testBoundedUnlock, ""},
	{"NestedNames", testNestedNames, ""},
	{"Liveness", testLiveness, ""},
	{"BadInput", testBadInput, ""},

	{"SemaphoreLimit", testSemaphoreLimit, needsSemaphore},
	{"SemaphoreTryLock", testSemaphoreTryLock, needsSemaphore},
	{"SemaphoreKilledHolder", testSemaphoreKilledHolder, needsSemaphore},
	{"SemaphoreCancelCleanup", testSemaphoreCancelCleanup, needsSemaphore},
	{"SemaphoreLimitMismatch", testSemaphoreLimitMismatch, needsSemaphore},
	{"SemaphorePromptAdmission", testSemaphorePromptAdmission, needsSemaphore},
	{"SemaphoreReentrancy", testSemaphoreReentrancy, needsSemaphore},

	{"RWExclusion", testRWExclusion, needsRWMutex},
	{"RWReadersShare", testRWReadersShare, needsRWMutex},
	{"RWWriterNotStarved", testRWWriterNotStarved, needsRWMutex},
	{"RWCancelCleanup", testRWCancelCleanup, needsRWMutex},
	{"RWTokens", testRWTokens, needsRWMutex},
	{"RWPromptAdmission", testRWPromptAdmission, needsRWMutex},
	{"RWDowngrade", testRWDowngrade, needsRWMutex},
	{"RWReentrancy", testRWReentrancy, needsRWOptions},

	{"ElectionOneLeader", testElectionOneLeader, needsElection},
	{"ElectionObserve", testElectionObserve, needsElection},
	{"ElectionObserveWinners", testElectionObserveWinners, needsElection},
	{"ElectionLeader", testElectionLeader, needsElection},
	{"ElectionResign", testElectionResign, needsElection},
	{"ElectionFailover", testElectionFailover, needsElection},

	{"ClaimOnce", testClaimOnce, needsClaimer},
	{"ClaimLate", testClaimLate, needsClaimer},
	{"ClaimAtMost", testClaimAtMost, needsClaimer},
	{"ClaimTicks", testClaimTicks, needsClaimer},

	{"MultiNoDeadlock", testMultiNoDeadlock, needsMulti},
	{"MultiCancel", testMultiCancel, needsMulti},
	{"MultiLoss", testMultiLoss, needsMulti},
	{"MultiFIFO", testMultiFIFO, needsMulti},
}

// Run runs every test of the suite as a subtest of t. Each subtest uses a
// fresh lock name, "conformance/<subtest>/<random>". Run does not call
// t.Parallel, and its subtests run one after another.
//
// The properties of an optional primitive (semaphore, read-write lock,
// election) run only if the Backend's constructor for it is set; Run logs
// which ones it leaves out, and skips none (a skipped test would hide
// nothing more than an absent one, and CI forbids skips).
func Run(t *testing.T, b Backend) {
	t.Helper()
	switch {
	case b.NewLocker == nil:
		t.Fatal("conformance: Backend.NewLocker is nil")
	case b.Keys == nil:
		t.Fatal("conformance: Backend.Keys is nil")
	case b.Delete == nil:
		t.Fatal("conformance: Backend.Delete is nil")
	case b.TTL <= 0 || b.Margin < 0 || b.Margin >= b.TTL:
		t.Fatalf("conformance: Backend.TTL %v and Margin %v: want 0 <= Margin < TTL", b.TTL, b.Margin)
	case b.LossNotice <= 0:
		t.Fatal("conformance: Backend.LossNotice must be positive")
	case b.OpTimeout < 0:
		t.Fatal("conformance: Backend.OpTimeout is negative")
	}
	set := map[string]bool{
		"":             true,
		needsSemaphore: b.NewSemaphore != nil,
		needsRWMutex:   b.NewRWMutex != nil,
		needsRWOptions: b.TryNewRWMutex != nil,
		needsElection:  b.NewElection != nil,
		needsClaimer:   b.NewClaimer != nil,
		needsMulti:     b.NewMultiLocker != nil,
	}
	left := map[string][]string{}
	for _, st := range subtests {
		if !set[st.needs] {
			left[st.needs] = append(left[st.needs], st.name)
		}
	}
	for _, needs := range []string{needsSemaphore, needsRWMutex, needsRWOptions, needsElection, needsClaimer, needsMulti} {
		if len(left[needs]) > 0 {
			t.Logf("conformance: Backend.%s is nil: not running %s", needs, strings.Join(left[needs], ", "))
		}
	}
	for _, st := range subtests {
		if !set[st.needs] {
			continue
		}
		t.Run(st.name, func(t *testing.T) {
			st.fn(newSuite(t, b, st.name))
		})
	}
}

// suite is the state of one subtest.
type suite struct {
	t    *testing.T
	b    Backend
	name string
	op   time.Duration
	root context.Context // cancelled when the subtest ends
}

func newSuite(t *testing.T, b Backend, subtest string) *suite {
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatalf("conformance: random lock name: %v", err)
	}
	name := "conformance/" + subtest + "/" + hex.EncodeToString(rnd[:])
	if err := holdfast.ValidateName(name); err != nil {
		t.Fatalf("conformance: lock name: %v", err)
	}
	op := b.OpTimeout
	if op == 0 {
		op = defaultOpTimeout
	}
	t.Logf("lock name %q", name)
	return &suite{t: t, b: b, name: name, op: op, root: t.Context()}
}

// locker returns a new Locker on a session of its own.
func (s *suite) locker(opts ...holdfast.LockOption) holdfast.Locker {
	s.t.Helper()
	l, _ := s.lockerFaults(opts...)
	return l
}

// lockerFaults returns a new Locker and the faults of its session.
func (s *suite) lockerFaults(opts ...holdfast.LockOption) (holdfast.Locker, Faults) {
	s.t.Helper()
	return s.lockerOn(s.name, opts...)
}

// lockerOn returns a new Locker for another name, and its faults.
func (s *suite) lockerOn(name string, opts ...holdfast.LockOption) (holdfast.Locker, Faults) {
	s.t.Helper()
	l, f := s.b.NewLocker(s.t, name, opts...)
	if l == nil {
		s.t.Fatal("Backend.NewLocker returned a nil Locker")
	}
	s.faults(f, "NewLocker")
	return l, f
}

// faults checks the faults a Backend constructor returned and mends them
// when the subtest ends.
func (s *suite) faults(f Faults, from string) {
	s.t.Helper()
	if f.Kill == nil || f.Cut == nil || f.Freeze == nil || f.Mend == nil || f.Close == nil || f.Requests == nil {
		s.t.Fatalf("Backend.%s returned Faults with a nil function", from)
	}
	s.t.Cleanup(f.Mend)
}

// ctx returns a context bounded by d and by the end of the subtest.
func (s *suite) ctx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.root, d)
}

// keys reads the keys under the lock name, sorted.
func (s *suite) keys() []string {
	s.t.Helper()
	return slices.Sorted(slices.Values(s.b.Keys(s.t, s.name)))
}

// waitKeys polls the keys until ok accepts them or d has passed. It returns
// the last keys read and whether ok accepted them.
func (s *suite) waitKeys(d time.Duration, ok func([]string) bool) ([]string, bool) {
	s.t.Helper()
	deadline := time.Now().Add(d)
	for {
		ks := s.keys()
		if ok(ks) {
			return ks, true
		}
		if time.Now().After(deadline) || s.root.Err() != nil {
			return ks, false
		}
		time.Sleep(poll)
	}
}

// track makes sure g is released when the subtest ends, whatever happened
// to it, so that a failing subtest leaves as little as possible behind (the
// backend's own cleanup removes the rest with the sessions).
func (s *suite) track(g holdfast.Grant) {
	if g == nil {
		return
	}
	s.t.Cleanup(func() {
		if g.Context().Err() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), slack)
		defer cancel()
		_ = g.Unlock(ctx)
	})
}

// lock takes l with Lock, bounded by the operation timeout, and fails the
// subtest now if it cannot.
func (s *suite) lock(l holdfast.Locker, who string) holdfast.Grant {
	s.t.Helper()
	return s.acquire(l, who, false)
}

// tryLock takes l with TryLock and fails the subtest now if it cannot.
func (s *suite) tryLock(l holdfast.Locker, who string) holdfast.Grant {
	s.t.Helper()
	return s.acquire(l, who, true)
}

func (s *suite) acquire(l holdfast.Locker, who string, try bool) holdfast.Grant {
	s.t.Helper()
	verb := "Lock"
	if try {
		verb = "TryLock"
	}
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	r := s.await(start(ctx, l, try), s.op+slack, who+": "+verb)
	if r.err != nil {
		s.t.Fatalf("%s: %s: %v", who, verb, r.err)
	}
	if r.g == nil {
		s.t.Fatalf("%s: %s returned a nil Grant and a nil error", who, verb)
	}
	s.track(r.g)
	return r.g
}

// unlock releases g with a good context and expects nil.
func (s *suite) unlock(g holdfast.Grant, who string) {
	s.t.Helper()
	if err := s.unlockErr(g); err != nil {
		s.t.Errorf("%s: Unlock: %v, want nil", who, err)
	}
}

// unlockErr releases g with a good context, bounded, and returns its error.
func (s *suite) unlockErr(g holdfast.Grant) error {
	s.t.Helper()
	ctx, cancel := s.ctx(s.op)
	defer cancel()
	return s.unlockWith(ctx, g)
}

// unlockWith calls g.Unlock(ctx), bounded, and returns its error.
func (s *suite) unlockWith(ctx context.Context, g holdfast.Grant) error {
	s.t.Helper()
	done := make(chan error, 1)
	go func() { done <- g.Unlock(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(s.op + slack):
		s.t.Fatalf("Unlock of %s did not return within %v", g.Key(), s.op+slack)
		return nil
	}
}

// result is what a Lock or TryLock call returned, and how long it took.
type result struct {
	g    holdfast.Grant
	err  error
	took time.Duration
	at   time.Time // when the call returned
}

// start calls Lock (or TryLock) in a goroutine and delivers its result.
func start(ctx context.Context, l holdfast.Locker, try bool) <-chan result {
	ch := make(chan result, 1)
	go func() {
		t0 := time.Now()
		var r result
		if try {
			r.g, r.err = l.TryLock(ctx)
		} else {
			r.g, r.err = l.Lock(ctx)
		}
		r.at = time.Now()
		r.took = r.at.Sub(t0)
		ch <- r
	}()
	return ch
}

// await waits up to d for a result and fails the subtest now if none comes.
// A grant that arrives is tracked for release at the end of the subtest.
func (s *suite) await(ch <-chan result, d time.Duration, what string) result {
	s.t.Helper()
	select {
	case r := <-ch:
		if r.err == nil {
			s.track(r.g)
		}
		return r
	case <-time.After(d):
		s.t.Fatalf("%s did not return within %v", what, d)
		return result{}
	}
}

// early reports an error if ch has a result already (a call that should
// still be blocked) and returns that result, with true.
func (s *suite) early(ch <-chan result, what string) (result, bool) {
	s.t.Helper()
	select {
	case r := <-ch:
		if r.err == nil {
			s.track(r.g)
		}
		s.t.Errorf("%s returned while it should still be waiting: grant %s, err %v", what, describe(r.g), r.err)
		return r, true
	default:
		return result{}, false
	}
}

// waiting fails the subtest now if ch has a result already: a call that
// should still be blocked returned (the properties of semaphores, RW locks
// and elections stop there rather than wait out what follows).
func (s *suite) waiting(ch <-chan result, what string) {
	s.t.Helper()
	if _, early := s.early(ch, what); early {
		s.t.FailNow()
	}
}

// waitGroup waits for wg up to d; it reports whether wg finished.
func waitGroup(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// errList collects failures from goroutines other than the subtest's, so
// that they never touch t (which they may outlive if the subtest fails).
type errList struct {
	mu   sync.Mutex
	msgs []string
}

func (e *errList) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.msgs = append(e.msgs, fmt.Sprintf(format, args...))
}

// report fails t with every collected message.
func (e *errList) report(t *testing.T) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	const max = 20
	for i, m := range e.msgs {
		if i == max {
			t.Errorf("... and %d more", len(e.msgs)-max)
			break
		}
		t.Error(m)
	}
}

// describe prints a grant for failure messages.
func describe(g holdfast.Grant) string {
	if g == nil {
		return "<nil>"
	}
	return fmt.Sprintf("{key %q, token %d}", g.Key(), g.Token())
}

// isDone reports whether ctx is done, without waiting.
func isDone(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// waitDone waits up to d for ctx to be done.
func waitDone(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return true
	case <-timer.C:
		return false
	}
}

// grows accepts a key list longer than n.
func grows(n int) func([]string) bool {
	return func(ks []string) bool { return len(ks) > n }
}

// equals accepts exactly want.
func equals(want []string) func([]string) bool {
	return func(ks []string) bool { return slices.Equal(ks, want) }
}

// empty accepts no keys.
func empty(ks []string) bool { return len(ks) == 0 }

// without returns the keys of after that are not in before.
func without(after, before []string) []string {
	var extra []string
	for _, k := range after {
		if !slices.Contains(before, k) {
			extra = append(extra, k)
		}
	}
	return extra
}

// under reports whether key is under the lock name.
func (s *suite) under(key string) bool {
	return strings.HasPrefix(key, s.name+"/") && len(key) > len(s.name)+1
}

// occupancy is a fenced counter of the grants whose holders are inside a
// critical section: a grant counts while its context is live, so that a
// holder told of its loss (and the store free to grant again) is not
// counted against the store, while a store that admits too many holders
// is.
type occupancy struct {
	mu     sync.Mutex
	inside map[holdfast.Grant]string // grant -> its kind ("read", "write", "")
	max    map[string]int            // kind -> most live grants of it at once
}

func newOccupancy() *occupancy {
	return &occupancy{inside: make(map[holdfast.Grant]string), max: make(map[string]int)}
}

// enter records g, of kind, as inside, and returns how many live grants of
// each kind are inside now, g included, with their descriptions.
func (o *occupancy) enter(g holdfast.Grant, kind string) (map[string]int, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.inside[g] = kind
	live := make(map[string]int)
	var who []string
	for h, k := range o.inside {
		if h.Context().Err() == nil {
			live[k]++
			who = append(who, k+describe(h))
		}
	}
	for k, n := range live {
		o.max[k] = max(o.max[k], n)
	}
	slices.Sort(who)
	return live, who
}

// leave records that g's holder has left.
func (o *occupancy) leave(g holdfast.Grant) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.inside, g)
}

// most returns the most live grants of kind seen inside at once.
func (o *occupancy) most(kind string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.max[kind]
}

// idle accepts keys that a primitive may leave with nobody holding or
// waiting: none, or only bookkeeping keys whose last path element starts
// with "." (Consul's "<name>/.lock", which holds a semaphore's limit).
func idle(ks []string) bool {
	for _, k := range ks {
		if !strings.HasPrefix(k[strings.LastIndex(k, "/")+1:], ".") {
			return false
		}
	}
	return true
}
