package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
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
	// Tokens is how many turns the floor's relay carries (the semaphore's
	// limit; 1 for a lock): contenders 0 to Tokens-1 start with one each.
	Tokens int
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

// scenarioSpec is a registered scenario. A scenario of its own file
// registers itself with registerScenario from an init function; Run, "all"
// and the quick run (Options.Quick) then include it.
type scenarioSpec struct {
	name string
	// inAll: "all" runs it, in registration order.
	inAll bool
	// run runs the scenario's rows with r.opts: it emits Results with
	// r.emitRows/r.emit, or rows of its own with r.emitOther.
	run func(r *runner, ctx context.Context) error
	// quick returns the options of the scenario's part of a quick run,
	// given the run's options before defaults: small settings and short
	// windows, so that every scenario on both stores fits in 2 minutes.
	quick func(Options) Options
	// table writes the scenario's own rows (those it emitted with
	// emitOther) for humans; nil if it emits Results only.
	table func(w io.Writer, rows []any) error
}

// registry holds the scenarios, the built-in ones first (package variables
// are initialised before any init function runs).
var registry = []scenarioSpec{
	{name: ScenarioLock, inAll: true, run: func(r *runner, ctx context.Context) error { return r.contended(ctx, ScenarioLock) }, quick: quickContended(1, 4)},
	{name: ScenarioHandoff, inAll: true, run: func(r *runner, ctx context.Context) error { return r.contended(ctx, ScenarioHandoff) }, quick: quickContended(4)},
	{name: ScenarioTakeover, inAll: true, run: (*runner).takeover, quick: quickTakeover},
	{name: ScenarioElection, inAll: true, run: (*runner).election, quick: quickTakeover},
	{name: ScenarioSemaphore, inAll: true, run: (*runner).semaphore, quick: quickSemaphore},
	{name: ScenarioWaiters, inAll: true, run: (*runner).waiters, quick: quickWaiters},
}

// registerScenario adds s to the registry. It panics on a duplicate name
// (a programming error, caught by any test of the package).
func registerScenario(s scenarioSpec) {
	if _, ok := lookupScenario(s.name); ok || s.name == ScenarioAll {
		panic("bench: scenario " + s.name + " registered twice")
	}
	registry = append(registry, s)
}

func lookupScenario(name string) (scenarioSpec, bool) {
	for _, s := range registry {
		if s.name == name {
			return s, true
		}
	}
	return scenarioSpec{}, false
}

// ScenarioNames returns the registered scenarios, in the order "all" runs
// those it runs.
func ScenarioNames() []string {
	out := make([]string, len(registry))
	for i, s := range registry {
		out[i] = s.name
	}
	return out
}

// IsScenario reports whether name is a registered scenario or "all".
func IsScenario(name string) bool {
	_, ok := lookupScenario(name)
	return ok || name == ScenarioAll
}

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
	// Waiters of the waiters scenario: one row per number of waiters on
	// one lock. Default 2, 16, 128, 512.
	Waiters []int
	// Locks of the many-locks scenario: one level per number of locks held
	// through one session. Default 1,000 and 10,000 (see ManyLocksOptions).
	Locks []int
	// Quick runs every scenario with its quick settings (see
	// scenarioSpec.quick) instead of these options' counts and windows.
	Quick bool
	// Log receives progress lines (nil: discarded).
	Log io.Writer
	// OnResult is called with each result as soon as its row is done,
	// OnRatio with each holdfast/native pair, and OnOther with each row of
	// a scenario with rows of its own. Any may be nil.
	OnResult func(Result)
	OnRatio  func(Ratio)
	OnOther  func(any)
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
	for _, n := range o.Waiters {
		if n < 1 || n > 1023 {
			return fmt.Errorf("%w: waiters must be between 1 and 1023, got %d", ErrUsage, n)
		}
	}
	if err := (ManyLocksOptions{Locks: o.Locks}).Validate(); err != nil {
		return err
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
	Results []Result
	Ratios  []Ratio
	// Other holds the rows of scenarios with rows of their own, in order.
	Other      []any
	Violations int
	Errors     int
}

// Failed reports whether the run saw a violation or an error.
func (s Summary) Failed() bool { return s.Violations > 0 || s.Errors > 0 }

// Run runs scenario (a registered scenario or "all") on t with every
// implementation of t, alternating them (see the package doc). With
// opts.Quick every scenario runs with its quick settings. It returns what it
// measured so far together with any error that stopped it (ctx cancelled, a
// contender that could not connect); violations and errors seen while
// measuring are counted in the Summary, not returned.
func Run(ctx context.Context, t Target, scenario string, opts Options) (Summary, error) {
	if err := opts.Validate(); err != nil {
		return Summary{}, err
	}
	var specs []scenarioSpec
	if scenario == ScenarioAll {
		for _, s := range registry {
			if s.inAll {
				specs = append(specs, s)
			}
		}
	} else if s, ok := lookupScenario(scenario); ok {
		specs = []scenarioSpec{s}
	} else {
		return Summary{}, fmt.Errorf("%w: unknown scenario %q (want %s or all)", ErrUsage, scenario, strings.Join(ScenarioNames(), ", "))
	}
	r := &runner{t: t, runID: randomID()}
	for _, sc := range specs {
		o := opts
		if opts.Quick && sc.quick != nil {
			o = sc.quick(opts)
		}
		r.opts = o.withDefaults()
		if err := sc.run(r, ctx); err != nil {
			return r.sum, err
		}
	}
	return r.sum, nil
}

// Quick settings. A quick run keeps each scenario's structure (every
// implementation, the floor, the alternation in 3 rounds) with the smallest
// settings that exercise it: contender and waiter counts given in the
// options are kept, the windows are always the quick ones (200 ms per round
// after a 50 ms warm-up).
const (
	quickDuration = 600 * time.Millisecond
	quickWarmup   = 150 * time.Millisecond
)

func quickWindows(o Options) Options {
	o.Duration, o.Warmup, o.Rounds = quickDuration, quickWarmup, 3
	return o
}

func quickContended(contenders ...int) func(Options) Options {
	return func(o Options) Options {
		o = quickWindows(o)
		if o.Contenders == nil {
			o.Contenders = contenders
		}
		return o
	}
}

func quickTakeover(o Options) Options {
	o.Repeats = 1
	o.LockDelays = []time.Duration{0}
	return o
}

func quickSemaphore(o Options) Options {
	o = quickContended(4)(o)
	o.Limit = 2
	hold := time.Duration(0)
	o.Hold = &hold
	return o
}

func quickWaiters(o Options) Options {
	o = quickWindows(o)
	if o.Waiters == nil {
		o.Waiters = []int{2, 16}
	}
	return o
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

// emitOther records a row of a scenario with rows of its own, with the
// violations and errors it saw.
func (r *runner) emitOther(row any, violations, errors int) {
	r.sum.Other = append(r.sum.Other, row)
	r.sum.Violations += violations
	r.sum.Errors += errors
	if r.opts.OnOther != nil {
		r.opts.OnOther(row)
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
