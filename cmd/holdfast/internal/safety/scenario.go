package safety

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// Summary is what a scenario run did and what the checkers found.
type Summary struct {
	Backend  string
	Duration time.Duration
	Faults   map[string]int
	Stats
	FenceViolations     []string
	ToldFirstViolations []string
	// ReleaseViolations are successful Unlocks of superseded grants (see
	// CheckReleases; a lock or an election only).
	ReleaseViolations []string
	GrantsChecked     int
	Linearizable      porcupine.CheckResult
	// Witnesses explain a history that is not linearizable (see Explain).
	Witnesses []string
	LeftKeys  []string
	// Ended is how many grants a fault ended: a holder cut off (its
	// connection blackholed or frozen, its session destroyed) whose grant
	// context was done with a loss, not a release, within the fault's
	// window (while it lasted, plus the TTL). MaxNotice is the longest time
	// from such a fault to the grant's context being done; MaxTakeover the
	// longest from such a fault to the next grant of a newer token.
	Ended                  int
	MaxNotice, MaxTakeover time.Duration
	// Liveness: the intervals in which the lock was free (fewer live
	// grants than the limit) while a client waited in Lock, the longest
	// and their sum, each attributed to its nearest fault, and those over
	// their bound (see CheckLiveness).
	Liveness Liveness
	// Shards and Moves: the shard primitive's group size, and how many
	// times a shard moved from one member to another (shard.ErrMoved);
	// LongestShard is the shard of Liveness.Longest.
	Shards, Moves, LongestShard int
	LongestBetween              string // the ops that bound it
}

// OK reports whether every checker passed.
func (s Summary) OK() bool {
	return len(s.FenceViolations) == 0 && len(s.ToldFirstViolations) == 0 && len(s.ReleaseViolations) == 0 &&
		s.Linearizable == porcupine.Ok && len(s.LeftKeys) == 0 && s.Grants > 0 && len(s.Liveness.Violations) == 0
}

// String is the summary's report, one line per subject.
func (s Summary) String() string {
	var faults []string
	for k, v := range s.Faults {
		faults = append(faults, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(faults)
	if len(faults) == 0 {
		faults = []string{NoFaults}
	}
	var shards string
	if s.Shards > 0 {
		shards = fmt.Sprintf("\nshards: %d, moved %d times; the longest free interval: shard %d, from %v to %v%s", s.Shards, s.Moves,
			s.LongestShard, s.Liveness.Longest.From.Round(time.Millisecond), s.Liveness.Longest.To.Round(time.Millisecond), s.LongestBetween)
	}
	return fmt.Sprintf(`backend: %s, %v
faults injected: %s
operations: grants=%d lock_failures=%d sessions=%d lost=%d
fenced writes: accepted=%d rejected=%d (stale)
violations: fence=%d told_first=%d (of %d grants) release=%d linearizable=%v keys_left=%d
grants a fault ended: %d; worst fault-to-notice: %v; worst takeover: %v
liveness: free while a contender waited: longest %v (%s), sum %v over %d intervals (by nearest fault: %s), over their bound %d%s`,
		s.Backend, s.Duration.Round(time.Second), strings.Join(faults, " "),
		s.Grants, s.LockFailures, s.Sessions, s.Lost, s.Writes-s.Rejected, s.Rejected,
		len(s.FenceViolations), len(s.ToldFirstViolations), s.GrantsChecked, len(s.ReleaseViolations), s.Linearizable, len(s.LeftKeys),
		s.Ended, s.MaxNotice.Round(time.Millisecond), s.MaxTakeover.Round(time.Millisecond),
		s.Liveness.Longest.Len().Round(time.Millisecond), s.Liveness.Longest.near(), s.Liveness.Sum.Round(time.Millisecond), s.Liveness.Gaps, s.Liveness.BySum(), len(s.Liveness.Violations), shards)
}

// faultLog counts faults and measures notice and takeover times.
type faultLog struct {
	h         *History // the clock of spans
	mu        sync.Mutex
	counts    map[string]int
	spans     []Fault // every fault injected, for the liveness checker
	ended     int
	notice    time.Duration
	takeovers []takeover
}

type takeover struct {
	at    time.Duration // history clock
	token holdfast.Token
}

// count counts a fault of kind injected now; mended ends it.
func (f *faultLog) count(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.counts == nil {
		f.counts = map[string]int{}
	}
	f.counts[kind]++
	at := f.h.Now()
	f.spans = append(f.spans, Fault{Kind: kind, Start: at, End: -1, EndsSessions: kind != "delete-waiter-key" && kind != "restart-member"})
}

// mended records that the fault injected last (if any) is mended.
func (f *faultLog) mended() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.spans); n > 0 && f.spans[n-1].End < 0 {
		f.spans[n-1].End = f.h.Now()
	}
}

// victim starts timing a fault that cuts off the holder of g (if any), for
// a grant the fault ends: one whose context is done with a loss (not a
// release) within window of the fault's start (the fault's length plus the
// TTL: a loss after that has another cause). It measures the time until
// the context is done (notice) and until a newer token is granted
// (takeover, computed from the history afterwards).
func (f *faultLog) victim(h *History, g holdfast.Grant, window time.Duration) {
	if g == nil || g.Context().Err() != nil {
		return
	}
	start, at := time.Now(), h.Now()
	context.AfterFunc(g.Context(), func() {
		d := time.Since(start)
		if errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) || d > window {
			return // released, or lost long after the fault
		}
		f.mu.Lock()
		f.ended++
		f.notice = max(f.notice, d)
		f.takeovers = append(f.takeovers, takeover{at: at, token: g.Token()})
		f.mu.Unlock()
	})
}

// victims calls victim for the grant of every client whose connection goes
// to server m (client i talks to server i mod servers), as a fault on m
// cuts them off.
func (f *faultLog) victims(w *Workload, clients, servers, m int, window time.Duration) {
	for v := range clients {
		if v%servers == m {
			f.victim(w.History, w.Tracker.Grant(v), window)
		}
	}
}

// finish fills s from the run's records; live bounds the liveness
// checker.
func finish(s *Summary, w *Workload, st Stats, faults *faultLog, live LivenessBounds) {
	s.Stats = st
	s.FenceViolations = CheckFence(w.Resource.Writes())
	s.ToldFirstViolations, s.GrantsChecked = w.Tracker.Violations()
	ops := w.History.Ops()
	shared := w.Tracker.Limit > 1 // a semaphore's permits may share a token (Consul)
	if !shared {
		s.ReleaseViolations = CheckReleases(ops)
	}
	s.Linearizable = CheckLinearizable(ops, shared, 2*time.Minute)
	if s.Linearizable != porcupine.Ok {
		s.Witnesses = Explain(ops, shared)
	}
	faults.mu.Lock()
	defer faults.mu.Unlock()
	s.Liveness = CheckLiveness(ops, max(w.Tracker.Limit, 1), faults.spans, live)
	s.Faults = faults.counts
	s.Ended = faults.ended
	s.MaxNotice = faults.notice
	for _, t := range faults.takeovers {
		for _, op := range ops {
			if op.Kind == Acquire && op.OK && op.Token > t.token && op.Return >= t.at {
				s.MaxTakeover = max(s.MaxTakeover, op.Return-t.at)
				break
			}
		}
	}
}

// Primitive is what a scenario's clients take.
type Primitive string

// Primitives: a lock, a semaphore of limit SemaphoreLimit, an election
// (Campaign as Lock, Unlock as Resign).
const (
	Lock      Primitive = "mutex"
	Semaphore Primitive = "semaphore"
	Elect     Primitive = "election"
)

// Primitives lists every Primitive.
var Primitives = []Primitive{Lock, Semaphore, Elect}

// SemaphoreLimit is the limit of the scenarios' semaphores.
const SemaphoreLimit = 2

// limit is how many grants of p may be live at once.
func (p Primitive) limit() int {
	if p == Semaphore {
		return SemaphoreLimit
	}
	return 1
}

// candidate adapts an election to holdfast.Locker: Lock campaigns.
type candidate[G holdfast.Grant] struct {
	campaign func(context.Context, []byte) (G, error)
	value    []byte
}

func (c candidate[G]) Lock(ctx context.Context) (holdfast.Grant, error) {
	g, err := c.campaign(ctx, c.value)
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (c candidate[G]) TryLock(context.Context) (holdfast.Grant, error) {
	return nil, errors.New("safety: an election has no TryLock")
}

// EtcdOptions shape RunEtcd.
type EtcdOptions struct {
	Duration  time.Duration // default 20 s
	Clients   int           // default 4
	Primitive Primitive     // default Lock
	Log       io.Writer     // faults as they happen; nil: none
	// Faults are the kinds of fault injected (default EtcdFaults, all;
	// NoFaults alone: none).
	Faults []string
	// LongHolds is the fraction of grants held for 4 s (twice the TTL), so
	// that faults find holders (default 0.2; negative: none; 1: all).
	LongHolds float64
	// HolderFaults: the client faults (blackhole-client, pause-client) hit
	// a holder whenever there is one, for 3 to 4 s (beyond the TTL), instead
	// of mostly a holder for 1 to 3.5 s; and long holds last 8 s, so that
	// the fault, not the holder's Unlock, ends the grant.
	HolderFaults bool
}

// NoFaults, as the only element of Faults, runs a scenario without
// faults: the baseline that grants per minute under faults are compared to.
const NoFaults = "none"

// EtcdFaults are the kinds of fault of the etcd scenario.
var EtcdFaults = []string{"stop-follower", "stop-leader", "cut-leader-peers", "blackhole-client", "pause-client", "delete-waiter-key", "delete-holder-key"}

// ConsulFaults are the kinds of fault of the Consul scenario.
var ConsulFaults = []string{"kill-leader", "kill-follower", "freeze-leader", "freeze-follower", "destroy-session", "blackhole-client", "pause-client"}

// faultKinds returns asked, or all if asked is empty, after checking that
// each is one of all.
func faultKinds(asked, all []string) ([]string, error) {
	if len(asked) == 0 {
		return all, nil
	}
	if len(asked) == 1 && asked[0] == NoFaults {
		return nil, nil
	}
	for _, k := range asked {
		if !slices.Contains(all, k) {
			return nil, fmt.Errorf("%w: unknown fault %q (want one of %s)", holdfast.ErrInvalidArgument, k, strings.Join(all, ", "))
		}
	}
	return asked, nil
}

// longHolds is the fraction of long holds asked (negative: none).
func longHolds(f float64) float64 {
	switch {
	case f == 0:
		return 0.2
	case f < 0:
		return 0
	}
	return min(f, 1)
}

// RunEtcd runs the etcd scenario: a 3-member cluster in a temporary
// directory, Clients clients each through its own fault proxy to one
// member, taking one lock and writing to a fenced resource, while members
// are stopped and restarted, the leader is cut from its peers, and clients'
// connections are blackholed or frozen (below and beyond the 2 s TTL). It
// returns the checkers' findings; err is about the run itself.
func RunEtcd(ctx context.Context, o EtcdOptions) (Summary, error) {
	if o.Duration <= 0 {
		o.Duration = 20 * time.Second
	}
	if o.Clients <= 0 {
		o.Clients = 4
	}
	if o.Primitive == "" {
		o.Primitive = Lock
	}
	if o.Primitive == Shard {
		return runShardEtcd(ctx, o)
	}
	kinds, err := faultKinds(o.Faults, EtcdFaults)
	if err != nil {
		return Summary{}, err
	}
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", a...)
		}
	}
	c, err := etcdtest.StartEtcd("", 3)
	if err != nil {
		return Summary{}, err
	}
	defer c.Close()
	proxies := make([]*embedtest.Proxy, o.Clients)
	for i := range proxies {
		u, err := url.Parse(c.Endpoint(i % c.Size()))
		if err != nil {
			return Summary{}, err
		}
		if proxies[i], err = embedtest.NewProxy(u.Host); err != nil {
			return Summary{}, err
		}
		defer proxies[i].Close()
	}
	name := fmt.Sprintf("safety/etcd/%d", time.Now().UnixNano())
	longHold := 2 * etcd.MinTTL
	if o.HolderFaults {
		longHold = 4 * etcd.MinTTL
	}
	w := &Workload{
		Clients:   o.Clients,
		Writes:    12,
		Hold:      100 * time.Millisecond, // holds of 0.1 to 1.2 s
		LongHolds: longHolds(o.LongHolds),
		LongHold:  longHold,
		Resource:  NewResource(),
		History:   NewHistory(),
		Tracker:   &Tracker{Limit: o.Primitive.limit()},
		NewLocker: func(ctx context.Context, client int) (holdfast.Locker, func(), error) {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			s, err := etcd.Dial(dctx, []string{proxies[client].URL()}, etcd.WithTTL(etcd.MinTTL))
			if err != nil {
				return nil, nil, err
			}
			var l holdfast.Locker
			switch o.Primitive {
			case Semaphore:
				var m *etcd.Semaphore
				if m, err = etcd.NewSemaphore(s, name, SemaphoreLimit); err == nil {
					l = holdfast.AsLocker(m)
				}
			case Multi:
				l = etcdMulti(s, name)
			case Elect:
				var e *etcd.Election
				if e, err = etcd.NewElection(s, name); err == nil {
					l = candidate[*etcd.Grant]{campaign: e.Campaign, value: fmt.Appendf(nil, "client-%d", client)}
				}
			default:
				var m *etcd.Mutex
				if m, err = etcd.NewMutex(s, name); err == nil {
					l = holdfast.AsLocker(m)
				}
			}
			if err != nil {
				s.Close()
				return nil, nil, err
			}
			return l, func() { s.Close() }, nil
		},
	}
	runCtx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	faults := &faultLog{h: w.History}
	faultErr := make(chan error, 1)
	admin, err := c.NewClient()
	if err != nil {
		return Summary{}, err
	}
	defer admin.Close()
	go func() {
		faultErr <- etcdFaults(runCtx, c, admin, name, o.Primitive.limit(), kinds, o.HolderFaults, proxies, w, faults, logf)
	}()
	st := w.Run(runCtx)
	err = <-faultErr
	for _, p := range proxies {
		p.Mend()
	}
	s := Summary{Backend: fmt.Sprintf("etcd (3 members), %s", o.Primitive), Duration: o.Duration}
	finish(&s, w, st, faults, LivenessBounds{Base: time.Second, Expiry: etcd.MinTTL})
	s.LeftKeys = leftKeysEtcd(c, name)
	return s, err
}

// etcdFaults injects one fault at a time, each mended before the next.
func etcdFaults(ctx context.Context, c *etcdtest.Cluster, admin *clientv3.Client, name string, limit int, kinds []string, holderFaults bool, proxies []*embedtest.Proxy, w *Workload, faults *faultLog, logf func(string, ...any)) error {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	defer faults.mended()
	if len(kinds) == 0 { // NoFaults
		<-ctx.Done()
		return nil
	}
	for ctx.Err() == nil {
		faults.mended()
		sleep(ctx, 500*time.Millisecond+time.Duration(rng.IntN(1000))*time.Millisecond)
		if ctx.Err() != nil {
			return nil
		}
		leader, err := c.WaitLeader(15 * time.Second)
		if err != nil {
			return err
		}
		kind := kinds[rng.IntN(len(kinds))]
		if kind != "delete-holder-key" { // counted if there is a holder
			faults.count(kind)
		}
		hold := func(lo, spread int) time.Duration {
			return time.Duration(lo+rng.IntN(spread)) * time.Millisecond
		}
		switch kind {
		case "stop-follower", "stop-leader":
			m := leader
			if kind == "stop-follower" {
				m = (leader + 1 + rng.IntN(c.Size()-1)) % c.Size()
			}
			d := hold(1000, 2000)
			logf("%s: member %d for %v", kind, m, d)
			faults.victims(w, len(proxies), c.Size(), m, d+etcd.MinTTL)
			if err := c.Stop(m); err != nil {
				return err
			}
			time.Sleep(d)
			if err := c.Restart(m); err != nil {
				return err
			}
		case "delete-waiter-key":
			// An operator deletes a waiting contender's key: that waiter
			// must fail (it re-checks its own key), never hold beside the
			// holder.
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := admin.Get(rctx, name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
			if err == nil && len(resp.Kvs) > limit {
				kv := resp.Kvs[limit+rng.IntN(len(resp.Kvs)-limit)]
				logf("%s: %s", kind, kv.Key)
				_, _ = admin.Txn(rctx).If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
					Then(clientv3.OpDelete(string(kv.Key))).Commit()
			}
			cancel()
		case "delete-holder-key":
			// An operator deletes a holder's key while the holder's
			// connection is frozen, so that it cannot hear of it: its
			// Unlock, called meanwhile, must not report success (its
			// release is guarded), and nothing else it does may count.
			h, ok := w.Tracker.Holder()
			g := w.Tracker.Grant(h)
			if !ok || g == nil || g.Context().Err() != nil {
				continue
			}
			faults.count(kind)
			proxies[h].Pause()
			w.Tracker.Exempt(g.Token()) // ended from outside: nobody can be told first
			faults.victim(w.History, g, etcd.MinTTL)
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := admin.Txn(rctx).If(clientv3.Compare(clientv3.CreateRevision(g.Key()), "=", int64(g.Token()))).
				Then(clientv3.OpDelete(g.Key())).Commit()
			cancel()
			logf("%s: client %d, %s (token %d): deleted=%v %v", kind, h, g.Key(), g.Token(), err == nil && resp.Succeeded, err)
			// Until the holder calls Unlock (its grant is released), for at
			// most 0.85 s: its safe deadline is at least 0.93 s away (TTL -
			// margin - the renewal period).
			for end := time.Now().Add(850 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				if g.Context().Err() != nil {
					break
				}
			}
			time.Sleep(50 * time.Millisecond)
			proxies[h].Mend()
		case "cut-leader-peers":
			logf("%s: member %d", kind, leader)
			c.CutPeer(leader)
			time.Sleep(hold(1500, 2000))
			c.MendPeer(leader)
		case "blackhole-client", "pause-client":
			v := rng.IntN(len(proxies))
			if h, ok := w.Tracker.Holder(); ok && (holderFaults || rng.IntN(3) > 0) {
				v = h // mostly the holder: the case that matters
			}
			d := hold(1000, 2500) // below and beyond the TTL
			if holderFaults {
				d = hold(3000, 1000)
			}
			logf("%s: client %d for %v", kind, v, d)
			faults.victim(w.History, w.Tracker.Grant(v), d+etcd.MinTTL)
			if kind == "blackhole-client" {
				proxies[v].Blackhole()
			} else {
				proxies[v].Pause()
			}
			time.Sleep(d)
			proxies[v].Mend()
		}
	}
	return nil
}

// lastContender takes and releases the scenario's name once through a
// fresh session on the leader.
func lastContender(ctx context.Context, w *Workload, c *embedtest.ConsulCluster, o ConsulOptions) error {
	leader, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	l, closeFn, err := w.NewLocker(ctx, leader%o.Clients)
	if err != nil {
		return err
	}
	defer closeFn()
	g, err := l.Lock(ctx)
	if err != nil {
		return err
	}
	return g.Unlock(ctx)
}

// leftKeysEtcd waits up to 10 s for the keys under name/ to go (the
// sessions are closed; an unreachable one expires) and returns any left.
func leftKeysEtcd(c *etcdtest.Cluster, name string) []string {
	cli, err := c.NewClient()
	if err != nil {
		return []string{"(no client: " + err.Error() + ")"}
	}
	defer cli.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err == nil && len(resp.Kvs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			var left []string
			if resp != nil {
				for _, kv := range resp.Kvs {
					left = append(left, string(kv.Key))
				}
			}
			if err != nil {
				left = append(left, "(read failed: "+err.Error()+")")
			}
			return left
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ConsulOptions shape RunConsul.
type ConsulOptions struct {
	Duration  time.Duration // default 20 s
	Clients   int           // default 4
	Primitive Primitive     // default Lock
	Log       io.Writer
	// Faults are the kinds of fault injected (default ConsulFaults, all;
	// NoFaults alone: none).
	Faults []string
	// LongHolds is the fraction of grants held for 12 s (past the TTL), so
	// that faults find holders (default 0.2; negative: none; 1: all).
	LongHolds float64
}

// RunConsul runs the Consul scenario on a real 3-server cluster: Clients
// clients, each through its own fault proxy to one server's HTTP API, take
// one lock (TTL 10 s, lock-delay 1 s) and write to a fenced resource, while
// the leader or a follower server is killed and restarted, holders'
// sessions are destroyed from outside, and clients' connections are
// blackholed or frozen around the TTL. Grants whose session is destroyed
// from outside are exempt from the told-first check (nobody can be told
// before that happens); the fence still judges their writes.
func RunConsul(ctx context.Context, o ConsulOptions) (Summary, error) {
	if o.Duration <= 0 {
		o.Duration = 20 * time.Second
	}
	if o.Clients <= 0 {
		o.Clients = 4
	}
	if o.Primitive == "" {
		o.Primitive = Lock
	}
	if o.Primitive == Shard {
		return runShardConsul(ctx, o)
	}
	kinds, err := faultKinds(o.Faults, ConsulFaults)
	if err != nil {
		return Summary{}, err
	}
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", a...)
		}
	}
	c, err := embedtest.StartConsulCluster(3)
	if err != nil {
		return Summary{}, err
	}
	defer c.Close()
	proxies := make([]*embedtest.Proxy, o.Clients)
	sessions := make([]*consul.Session, o.Clients)
	var smu sync.Mutex
	for i := range proxies {
		if proxies[i], err = embedtest.NewProxy(c.HTTPAddr(i % c.Size())); err != nil {
			return Summary{}, err
		}
		defer proxies[i].Close()
	}
	// admin returns a client of a running server.
	admin := func() (*api.Client, error) {
		l, err := c.WaitLeader(30 * time.Second)
		if err != nil {
			return nil, err
		}
		return c.NewClient(l)
	}
	name := fmt.Sprintf("safety/consul/%d", time.Now().UnixNano())
	w := &Workload{
		Clients:   o.Clients,
		Writes:    12,
		Hold:      100 * time.Millisecond,
		LongHolds: longHolds(o.LongHolds),
		LongHold:  consul.MinTTL + consul.MinTTL/5,
		Resource:  NewResource(),
		History:   NewHistory(),
		Tracker:   &Tracker{Limit: o.Primitive.limit()},
		NewLocker: func(ctx context.Context, client int) (holdfast.Locker, func(), error) {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			s, err := consul.Dial(dctx, proxies[client].Addr(), consul.WithTTL(consul.MinTTL), consul.WithLockDelay(time.Second))
			if err != nil {
				return nil, nil, err
			}
			var l holdfast.Locker
			switch o.Primitive {
			case Semaphore:
				var m *consul.Semaphore
				if m, err = consul.NewSemaphore(s, name, SemaphoreLimit); err == nil {
					l = holdfast.AsLocker(m)
				}
			case Multi:
				l = consulMulti(s, name)
			case Elect:
				var e *consul.Election
				if e, err = consul.NewElection(s, name); err == nil {
					l = candidate[*consul.Grant]{campaign: e.Campaign, value: fmt.Appendf(nil, "client-%d", client)}
				}
			default:
				var m *consul.Mutex
				if m, err = consul.NewMutex(s, name); err == nil {
					l = holdfast.AsLocker(m)
				}
			}
			if err != nil {
				s.Close()
				return nil, nil, err
			}
			smu.Lock()
			sessions[client] = s
			smu.Unlock()
			return l, func() { s.Close() }, nil
		},
	}
	runCtx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	faults := &faultLog{h: w.History}
	faultErr := make(chan error, 1)
	go func() {
		faultErr <- func() error {
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
			defer faults.mended()
			if len(kinds) == 0 { // NoFaults
				<-runCtx.Done()
				return nil
			}
			for runCtx.Err() == nil {
				faults.mended()
				sleep(runCtx, time.Duration(1000+rng.IntN(2000))*time.Millisecond)
				if runCtx.Err() != nil {
					return nil
				}
				kind := kinds[rng.IntN(len(kinds))]
				v := rng.IntN(o.Clients)
				if h, ok := w.Tracker.Holder(); ok && rng.IntN(3) > 0 {
					v = h
				}
				g := w.Tracker.Grant(v)
				switch kind {
				case "kill-leader", "kill-follower":
					leader, err := c.WaitLeader(30 * time.Second)
					if err != nil {
						return err
					}
					m := leader
					if kind == "kill-follower" {
						m = (leader + 1 + rng.IntN(c.Size()-1)) % c.Size()
					}
					d := time.Duration(1000+rng.IntN(3000)) * time.Millisecond
					faults.count(kind)
					logf("%s: server %d for %v", kind, m, d)
					faults.victims(w, o.Clients, c.Size(), m, d+consul.MinTTL)
					if err := c.Kill(m); err != nil {
						return err
					}
					sleep(runCtx, d)
					if err := c.Restart(m); err != nil {
						return err
					}
				case "freeze-leader", "freeze-follower":
					// A server that neither sends nor receives, past the
					// election timeout (1 s): what a partition does to it,
					// short of letting it run meanwhile (docs/SAFETY.md).
					leader, err := c.WaitLeader(30 * time.Second)
					if err != nil {
						return err
					}
					m := leader
					if kind == "freeze-follower" {
						m = (leader + 1 + rng.IntN(c.Size()-1)) % c.Size()
					}
					d := time.Duration(2000+rng.IntN(6000)) * time.Millisecond
					faults.count(kind)
					logf("%s: server %d for %v", kind, m, d)
					faults.victims(w, o.Clients, c.Size(), m, d+consul.MinTTL)
					if err := c.Freeze(m); err != nil {
						return err
					}
					sleep(runCtx, d)
					if err := c.Thaw(m); err != nil {
						return err
					}
				case "destroy-session":
					smu.Lock()
					s := sessions[v]
					smu.Unlock()
					if g == nil || s == nil {
						continue // destroy holders only
					}
					cli, err := admin()
					if err != nil {
						return err
					}
					faults.count(kind)
					logf("%s: client %d", kind, v)
					w.Tracker.Exempt(g.Token())
					faults.victim(w.History, g, consul.MinTTL)
					_, _ = cli.Session().Destroy(s.ID(), nil)
				default:
					d := time.Duration(3000+rng.IntN(10000)) * time.Millisecond // below and beyond the TTL
					faults.count(kind)
					logf("%s: client %d for %v", kind, v, d)
					faults.victim(w.History, g, d+consul.MinTTL)
					if kind == "blackhole-client" {
						proxies[v].Blackhole()
					} else {
						proxies[v].Pause()
					}
					sleep(runCtx, d)
					proxies[v].Mend()
				}
			}
			return nil
		}()
	}()
	st := w.Run(runCtx)
	err = <-faultErr
	for _, p := range proxies {
		p.Mend()
	}
	s := Summary{Backend: fmt.Sprintf("consul (3 servers), %s", o.Primitive), Duration: o.Duration}
	finish(&s, w, st, faults, LivenessBounds{Base: time.Second, Expiry: 2 * consul.MinTTL, LockDelay: time.Second})
	cli, aerr := admin()
	if aerr != nil {
		return s, errors.Join(err, aerr)
	}
	// Sessions invalidated during the run take their keys with them
	// (Behavior delete), but a Semaphore's NAME/.lock, which no session
	// holds, keeps naming a dead last holder until the next contender
	// prunes it. Once every session of the run has ended (a session whose Close could
	// not reach a killed server expires within twice its TTL), one last
	// acquisition by a fresh client plays that contender.
	for deadline := time.Now().Add(3 * consul.MinTTL); time.Now().Before(deadline); {
		if ss, _, lerr := cli.Session().List(nil); lerr == nil && len(ss) == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if serr := lastContender(ctx, w, c, o); serr != nil {
		err = errors.Join(err, fmt.Errorf("last contender: %w", serr))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		keys, _, kerr := cli.KV().Keys(name+"/", "", nil)
		if kerr == nil && len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			s.LeftKeys = keys
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return s, err
}
