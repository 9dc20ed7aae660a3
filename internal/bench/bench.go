package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// Implementation names used in results.
const (
	ImplHoldfast = "holdfast"
	ImplNative   = "native"
)

// Target is a running store and the lock implementations to compare on it.
type Target interface {
	// Backend is "etcd" or "consul".
	Backend() string
	// Impls returns the implementations, holdfast first, then native.
	Impls() []Impl
	// Kill ends a contender's session from a client of its own: it revokes
	// the etcd lease or destroys the Consul session whose ID the contender
	// reported, and returns once the store has done so.
	Kill(ctx context.Context, sessionID string) error
	// RPCUnit names what rpcs_per_acq counts on this backend.
	RPCUnit() string
	// Close closes the target's own clients and stops a server it started.
	Close() error
}

// Impl is one lock implementation on a Target.
type Impl interface {
	// Name is ImplHoldfast or ImplNative.
	Name() string
	// NewContender connects a new client and opens a new session for one
	// contender on the lock cfg.Lock. The caller must Close it.
	NewContender(ctx context.Context, cfg ContenderConfig) (Contender, error)
}

// ContenderConfig configures one contender.
type ContenderConfig struct {
	// Lock is the lock name (a key prefix; see the backends' key layouts).
	Lock string
	// Counter counts the store requests of this contender's client. Required.
	Counter *Counter
	// TTL is the session TTL.
	TTL time.Duration
	// LockDelay is the Consul session lock-delay; negative means the
	// store's default. Ignored on etcd.
	LockDelay time.Duration
	// Index is this contender's number (0 to Count-1) among the Count
	// contenders of its row. Only the floor uses them (contender i passes
	// the turn to i+1).
	Index, Count int
}

// Contender is one lock user with its own client and session.
type Contender interface {
	// Lock blocks until the lock is granted or ctx is done; on ctx it
	// returns an error matching ctx.Err().
	Lock(ctx context.Context) (Held, error)
	// SessionID identifies the session for Target.Kill (etcd: the lease ID
	// in hex; Consul: the session ID).
	SessionID() string
	// Close ends the session (revoking or destroying it) and closes the
	// client.
	Close() error
}

// Held is a granted lock.
type Held struct {
	// Unlock releases the lock.
	Unlock func(ctx context.Context) error
	// Lost is closed when the holder is told that it lost the lock (the
	// grant's context, etcd's session Done, api.Lock's lost channel). It may
	// be nil if the implementation cannot tell.
	Lost <-chan struct{}
}

// Scenario names.
const (
	ScenarioLock     = "lock"
	ScenarioHandoff  = "handoff"
	ScenarioTakeover = "takeover"
	ScenarioAll      = "all"
)

// Scenarios lists the runnable scenarios in the order "all" runs them.
var Scenarios = []string{ScenarioLock, ScenarioHandoff, ScenarioTakeover, ScenarioElection}

// Options configure a run. The zero value of a field means its default.
type Options struct {
	// Contenders per contended row (scenarios lock and handoff). Default:
	// lock 1, 8, 32; handoff 8, 32.
	Contenders []int
	// Duration of each contended row's measured window, over all its
	// rounds. Default 3 s.
	Duration time.Duration
	// Warmup before each contended row's window, over all its rounds (each
	// round warms up for Warmup/Rounds). Default 500 ms, at most half the
	// duration.
	Warmup time.Duration
	// Rounds: every contended setting runs Rounds rounds, each a window of
	// Duration/Rounds per implementation in turn (holdfast, native, floor),
	// and reports each implementation's windows together. Default 3.
	Rounds int
	// Hold is how long a holder keeps the lock; nil means the scenario's
	// default (lock 0, handoff 1 ms).
	Hold *time.Duration
	// TTL of every session. Default 15 s.
	TTL time.Duration
	// Repeats of each takeover setting. Default 3, and 2 for lock-delays of
	// 10 s or more unless set explicitly.
	Repeats int
	// LockDelays tried by the takeover scenario on Consul. Default 0, 1 s,
	// 15 s. (etcd has no lock-delay: one setting.)
	LockDelays []time.Duration
	// Limit of the semaphore scenario's semaphore. Default 4.
	Limit int
	// Log receives progress lines (nil: discarded).
	Log io.Writer
	// OnResult is called with each result as soon as its row is done, and
	// OnRatio with each holdfast/native pair. Either may be nil.
	OnResult func(Result)
	OnRatio  func(Ratio)
}

func (o Options) withDefaults() Options {
	if o.Duration <= 0 {
		o.Duration = 3 * time.Second
	}
	if o.Warmup <= 0 {
		o.Warmup = 500 * time.Millisecond
	}
	o.Warmup = min(o.Warmup, o.Duration/2)
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.TTL <= 0 {
		o.TTL = 15 * time.Second
	}
	if o.LockDelays == nil {
		o.LockDelays = []time.Duration{0, time.Second, 15 * time.Second}
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return o
}

// Validate reports bad options. Errors wrap ErrUsage.
func (o Options) Validate() error {
	for _, n := range o.Contenders {
		if n < 1 || n > 1024 {
			return fmt.Errorf("%w: contenders must be between 1 and 1024, got %d", ErrUsage, n)
		}
	}
	if o.Limit < 0 || o.Limit > 1024 {
		return fmt.Errorf("%w: limit must be between 1 and 1024, got %d", ErrUsage, o.Limit)
	}
	if o.Rounds < 0 || o.Rounds > 100 {
		return fmt.Errorf("%w: rounds must be between 1 and 100, got %d", ErrUsage, o.Rounds)
	}
	if o.Duration < 0 || o.Warmup < 0 || o.TTL < 0 || o.Repeats < 0 {
		return fmt.Errorf("%w: durations and repeats must not be negative", ErrUsage)
	}
	if o.Hold != nil && *o.Hold < 0 {
		return fmt.Errorf("%w: hold must not be negative", ErrUsage)
	}
	for _, d := range o.LockDelays {
		if d < 0 || d > 60*time.Second {
			return fmt.Errorf("%w: lock-delay must be between 0 and 60s, got %v", ErrUsage, d)
		}
	}
	return nil
}

// ErrUsage is wrapped by errors about bad options or scenario names.
var ErrUsage = errors.New("bench: bad usage")

// Summary totals a run.
type Summary struct {
	Results    []Result
	Ratios     []Ratio
	Violations int
	Errors     int
}

// Failed reports whether the run saw a violation or an error.
func (s Summary) Failed() bool { return s.Violations > 0 || s.Errors > 0 }

// Run runs scenario ("lock", "handoff", "takeover" or "all") on t with
// every implementation of t, holdfast and native alternating row by row. It
// returns what it measured so far together with any error that stopped it
// (ctx cancelled, a contender that could not connect); violations and
// errors seen while measuring are counted in the Summary, not returned.
func Run(ctx context.Context, t Target, scenario string, opts Options) (Summary, error) {
	if err := opts.Validate(); err != nil {
		return Summary{}, err
	}
	opts = opts.withDefaults()
	var scenarios []string
	switch scenario {
	case ScenarioAll:
		scenarios = Scenarios
	case ScenarioLock, ScenarioHandoff, ScenarioTakeover, ScenarioElection, ScenarioSemaphore:
		scenarios = []string{scenario}
	default:
		return Summary{}, fmt.Errorf("%w: unknown scenario %q (want lock, handoff, takeover, election, semaphore or all)", ErrUsage, scenario)
	}
	r := &runner{t: t, opts: opts, runID: randomID()}
	for _, sc := range scenarios {
		var err error
		if sc == ScenarioSemaphore {
			err = r.semaphore(ctx)
		} else if sc == ScenarioTakeover {
			err = r.takeover(ctx)
		} else if sc == ScenarioElection {
			err = r.election(ctx)
		} else {
			err = r.contended(ctx, sc)
		}
		if err != nil {
			return r.sum, err
		}
	}
	return r.sum, nil
}

// nodes returns the number of store members behind the target (0 if it
// cannot tell).
func (r *runner) nodes() int {
	if nt, ok := r.t.(interface{ Nodes() int }); ok {
		return nt.Nodes()
	}
	return 0
}

type runner struct {
	t     Target
	opts  Options
	runID string
	sum   Summary
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.opts.Log, "bench: "+format+"\n", args...)
}

func (r *runner) emit(res Result) {
	r.sum.Results = append(r.sum.Results, res)
	r.sum.Violations += res.Violations
	r.sum.Errors += res.Errors
	if r.opts.OnResult != nil {
		r.opts.OnResult(res)
	}
}

func (r *runner) emitRatio(q Ratio) {
	r.sum.Ratios = append(r.sum.Ratios, q)
	if r.opts.OnRatio != nil {
		r.opts.OnRatio(q)
	}
}

// pair emits the ratio of the holdfast and native results in rs, if both
// are there.
func (r *runner) pair(rs []Result) {
	var h, n *Result
	for i := range rs {
		switch rs[i].Impl {
		case ImplHoldfast:
			h = &rs[i]
		case ImplNative:
			n = &rs[i]
		}
	}
	if h != nil && n != nil {
		r.emitRatio(NewRatio(*h, *n))
	}
}

func (r *runner) lockName(parts ...any) string {
	s := "holdfast-bench/" + r.runID
	for _, p := range parts {
		s += fmt.Sprintf("/%v", p)
	}
	return s
}
