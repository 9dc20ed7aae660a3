package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/cmd/holdfast/internal/bench"
)

var benchCommand = &command{
	name:    "bench",
	summary: "benchmark holdfast's locks against the stores' native recipes",
	usage: `usage: holdfast bench [flags]

Runs holdfast's lock and the store's native recipe (etcd: concurrency.Mutex;
Consul: api.Lock) side by side against the same server, each contender with
its own client connection and session. Without --endpoints / --consul-addr it
starts its own server (embedded etcd in a temporary directory; a Consul dev
agent from scripts/consul.sh or $CONSUL_BIN) and stops it at the end.

Scenarios:
  lock      1, 8 and 32 contenders, hold 0 (the 1-contender row gives cycle_p50_ms)
  handoff   8 and 32 contenders, hold 1 ms (handoffs_per_s)
  takeover  a holder's session is destroyed/revoked while a waiter waits
            (Consul: lock-delay 0, 1 s, 15 s; takeover_ms, notice_ms)
  election  a leader's session is revoked/destroyed while a candidate waits and an
            observer watches (failover_ms, observe_ms; etcd: concurrency.Election,
            Consul: api.Lock with the proposal as value)
  semaphore a counting semaphore (--limit, default 4), 8 and 32 contenders,
            hold 0 and 1 ms (Consul: api.Semaphore side by side; etcd:
            holdfast alone, no native recipe); violations count moments
            with more than limit holders
  waiters   one lock, W waiters (--waiters, default 2,16,128,512), hold 0:
            requests and bytes per acquisition, handoff p50/p99 as the queue grows
  many-locks 1,000 and 10,000 locks (--locks) held through one session: time to
            acquire and release all, renewals per second, heap and goroutines per grant
  shard     a shard group (package shard) of 64 shards x 8 members and 1,024 x 16,
            started together: time until every shard is owned and the members
            balanced (cold_ms), then one member joins and one leaves: shards
            moved, time to settle, store requests per shard moved; violations
            count shards seen owned by two members at once (not in "all";
            --quick: 16 x 4)
  all       all of them but shard (--quick: every scenario, small settings, short windows)

Every contended row (lock, handoff, semaphore, waiters) is measured three
ways in the same run: holdfast, the native recipe, and the floor, a relay
with no safety (contender i watches its own key and writes the next one's:
one write and one notification per turn), the store's own limit. They
alternate in --rounds rounds so that drift on the machine hits all three;
of_floor is a row's acq/s divided by the floor's. --nodes 3 runs etcd
scenarios on an embedded 3-member cluster.

Output: an aligned table with ratio columns (vs_native, of_floor) and one
ratio line (holdfast/native) per setting, or with --json one JSON object per
row and one {"ratio": ...} object per pair (fields: internal/bench/doc.go).
Exits 1 if any row saw a mutual-exclusion violation or an error.`,
	flags: benchFlags,
}

func benchFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	backend := fs.String("backend", "etcd", "store: etcd or consul")
	scenario := fs.String("scenario", "lock", "lock, handoff, takeover, election, semaphore, waiters, many-locks, shard or all")
	limit := fs.Int("limit", 4, "semaphore scenario: how many may hold at once")
	contenders := fs.String("contenders", "", "comma-separated contender counts for lock/handoff (default: lock 1,8,32; handoff 8,32)")
	duration := fs.Duration("duration", 3*time.Second, "measured window of each contended row")
	warmup := fs.Duration("warmup", 500*time.Millisecond, "warm-up before each contended row's window")
	holdMS := new(optionalFloat)
	fs.Var(holdMS, "hold", "how long a holder keeps the lock, in `ms` (default: lock 0, handoff 1)")
	ttl := fs.Duration("ttl", 15*time.Second, "session TTL (etcd: whole seconds, >= 2s; Consul: >= 10s)")
	repeats := fs.Int("repeats", 0, "takeover repeats per setting (default 3; 2 for lock-delays >= 10s)")
	delays := fs.String("lock-delays", "0,1s,15s", "Consul takeover lock-delays, comma-separated durations")
	endpoints := fs.String("endpoints", "", "etcd endpoints, comma-separated (default: start an embedded etcd)")
	consulAddr := fs.String("consul-addr", "", "Consul agent HTTP address host:port (default: start a dev agent)")
	jsonOut := fs.Bool("json", false, "print one JSON object per line")
	locks := fs.String("locks", "", "many-locks scenario: comma-separated numbers of locks held at once (default 1000,10000)")
	waiters := fs.String("waiters", "", "waiters scenario: comma-separated numbers of waiters (default 2,16,128,512)")
	nodes := fs.Int("nodes", 1, "etcd: members of the embedded cluster (1 or 3)")
	rounds := fs.Int("rounds", 3, "alternation rounds per contended setting (the window is split among them)")
	quick := fs.Bool("quick", false, "every scenario with small settings and short windows (a smoke run, under 2 minutes per store)")
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) > 0 {
			return usagef("unexpected arguments: %s", strings.Join(args, " "))
		}
		opts := bench.Options{
			Duration: *duration,
			Warmup:   *warmup,
			TTL:      *ttl,
			Repeats:  *repeats,
			Limit:    *limit,
			Rounds:   *rounds,
			Quick:    *quick,
			Log:      e.stderr,
		}
		if *rounds < 1 || *rounds > 100 {
			return usagef("--rounds must be between 1 and 100")
		}
		if *nodes != 1 && *nodes != 3 {
			return usagef("--nodes must be 1 or 3")
		}
		if *nodes != 1 && (*backend != "etcd" || *endpoints != "") {
			return usagef("--nodes is for the embedded etcd (--backend etcd without --endpoints)")
		}
		if *waiters != "" {
			ws, err := parseInts(*waiters)
			if err != nil {
				return usagef("--waiters: %v", err)
			}
			opts.Waiters = ws
		}
		if *duration <= 0 {
			return usagef("--duration must be positive")
		}
		if *warmup < 0 {
			return usagef("--warmup must not be negative")
		}
		if *limit < 1 || *limit > 1024 {
			return usagef("--limit must be between 1 and 1024")
		}
		if *repeats < 0 {
			return usagef("--repeats must not be negative")
		}
		if holdMS.set {
			if holdMS.v < 0 || holdMS.v > 60_000 {
				return usagef("--hold must be between 0 and 60000 ms")
			}
			h := time.Duration(holdMS.v * float64(time.Millisecond))
			opts.Hold = &h
		}
		var err error
		if *contenders != "" {
			if opts.Contenders, err = parseInts(*contenders); err != nil {
				return usagef("--contenders: %v", err)
			}
		}
		if opts.LockDelays, err = parseDurations(*delays); err != nil {
			return usagef("--lock-delays: %v", err)
		}
		if *locks != "" {
			if opts.Locks, err = parseInts(*locks); err != nil {
				return usagef("--locks: %v", err)
			}
			if err := (bench.ManyLocksOptions{Locks: opts.Locks}).Validate(); err != nil {
				return usagef("--locks: %v", strings.TrimPrefix(err.Error(), bench.ErrUsage.Error()+": "))
			}
		}
		if !bench.IsScenario(*scenario) {
			return usagef("--scenario must be one of %s or all, not %q", strings.Join(bench.ScenarioNames(), ", "), *scenario)
		}
		switch *backend {
		case "etcd":
			if *consulAddr != "" {
				return usagef("--consul-addr is for --backend consul")
			}
			if *ttl < 2*time.Second || *ttl%time.Second != 0 {
				return usagef("--ttl must be a whole number of seconds, at least 2s, on etcd")
			}
		case "consul":
			if *endpoints != "" {
				return usagef("--endpoints is for --backend etcd")
			}
			if *ttl < 10*time.Second || *ttl > 24*time.Hour {
				return usagef("--ttl must be between 10s and 24h on Consul")
			}
		default:
			return usagef("--backend must be etcd or consul, not %q", *backend)
		}
		if err := opts.Validate(); err != nil {
			return usagef("%v", strings.TrimPrefix(err.Error(), bench.ErrUsage.Error()+": "))
		}

		if *jsonOut {
			opts.OnResult = func(r bench.Result) { bench.WriteJSON(e.stdout, r) }
			opts.OnRatio = func(q bench.Ratio) { bench.WriteRatioJSON(e.stdout, q) }
			opts.OnOther = func(row any) { bench.WriteJSON(e.stdout, row) }
		}

		t, err := openTarget(e, *backend, *endpoints, *consulAddr, *nodes)
		if err != nil {
			return err
		}
		sum, runErr := bench.Run(ctx, t, *scenario, opts)
		if err := t.Close(); err != nil && runErr == nil {
			fmt.Fprintf(e.stderr, "holdfast bench: closing %s: %v\n", *backend, err)
		}
		if !*jsonOut && (len(sum.Results) > 0 || len(sum.Other) > 0) {
			bench.WriteTable(e.stdout, sum)
		}
		if runErr != nil {
			if errors.Is(runErr, bench.ErrUsage) {
				return usagef("%v", runErr)
			}
			return runErr
		}
		if sum.Failed() {
			return fmt.Errorf("%d violations and %d errors (see the rows' first_error)", sum.Violations, sum.Errors)
		}
		return nil
	}
}

func openTarget(e *env, backend, endpoints, consulAddr string, nodes int) (bench.Target, error) {
	switch backend {
	case "etcd":
		if endpoints != "" {
			eps, err := endpointList("--endpoints", endpoints)
			if err != nil {
				return nil, err
			}
			return bench.DialEtcd(eps)
		}
		fmt.Fprintf(e.stderr, "bench: starting an embedded etcd (%d member(s), temporary directory)\n", nodes)
		t, err := bench.StartEtcdNodes(nodes)
		if err != nil {
			return nil, fmt.Errorf("start embedded etcd: %w", err)
		}
		return t, nil
	default:
		if consulAddr != "" {
			return bench.DialConsul(consulAddr)
		}
		fmt.Fprintln(e.stderr, "bench: starting a Consul dev agent")
		t, err := bench.StartConsul()
		if err != nil {
			return nil, fmt.Errorf("start Consul agent: %w", err)
		}
		return t, nil
	}
}

// splitList splits a comma-separated list, keeping empty items (as in
// "1,,2"), which every parser of a list refuses.
func splitList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	out := strings.Split(s, ",")
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	return out
}

// endpointList splits a list of endpoints, refusing empty items.
func endpointList(flag, s string) ([]string, error) {
	eps := splitList(s)
	if len(eps) == 0 || slices.Contains(eps, "") {
		return nil, usagef("%s %q: want a comma-separated list of host:port (or URLs), none empty", flag, s)
	}
	return eps, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range splitList(s) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", p)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func parseDurations(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, p := range splitList(s) {
		if p == "0" {
			out = append(out, 0)
			continue
		}
		d, err := time.ParseDuration(p)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%q is not a duration such as 0, 500ms or 15s", p)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// optionalFloat is a float flag that remembers whether it was given.
type optionalFloat struct {
	v   float64
	set bool
}

func (f *optionalFloat) String() string {
	if f == nil || !f.set {
		return ""
	}
	return strconv.FormatFloat(f.v, 'g', -1, 64)
}

func (f *optionalFloat) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return errors.New("not a number")
	}
	f.v, f.set = v, true
	return nil
}
