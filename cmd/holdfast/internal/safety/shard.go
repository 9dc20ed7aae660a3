package safety

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/shard"
)

// Shard is a shard group as a scenario's primitive: the clients are the
// members of one group of ShardCount shards (shard.Group.Run), and each
// shard's work writes to that shard's own fenced resource for as long as
// its context lives. Every shard has its own history, tracker and
// resource, judged by the same checkers as a lock's: fence, linearizable,
// told first (a member granted a shard while another member's grant of it
// is live), release (a shard released as held after a newer grant of it),
// and liveness, where a shard is wanted while any member runs (some member
// is always assigned it). Besides the store's faults, members are killed
// (their connection closed and their work stopped at once, as kill -9
// does; the session expires in the store), paused (their connection
// frozen, below and beyond the TTL) and restarted (Run's context ended:
// a graceful leave, then a join). It is not part of Primitives ("all"):
// ask for it by name.
const Shard Primitive = "shard"

// ShardCount is how many shards the shard scenario's group has.
const ShardCount = 8

// ShardMemberFaults are the member faults of the shard scenario, injected
// besides the store's (EtcdShardFaults, ConsulShardFaults).
var ShardMemberFaults = []string{"kill-member", "pause-member", "restart-member"}

// EtcdShardFaults and ConsulShardFaults are the kinds of fault of the
// shard scenario on each store.
var (
	EtcdShardFaults   = append([]string{"stop-follower", "stop-leader", "cut-leader-peers"}, ShardMemberFaults...)
	ConsulShardFaults = append([]string{"kill-leader", "kill-follower", "freeze-leader", "freeze-follower"}, ShardMemberFaults...)
)

// errKilled and errRestarted end a member instance's Run.
var (
	errKilled    = errors.New("safety: member killed")
	errRestarted = errors.New("safety: member restarted")
)

// shardRunner runs one member of the group through a session: Run with
// work and observer.
type shardRunner func(ctx context.Context, work func(context.Context, shard.Shard, holdfast.Grant), obs shard.Observer) error

// runnerOf returns the runner of a member of group name on st.
func runnerOf[G holdfast.Grant](st *shard.Store[G], name string) shardRunner {
	return func(ctx context.Context, work func(context.Context, shard.Shard, holdfast.Grant), obs shard.Observer) error {
		g, err := shard.New(st, name, shard.Config{Shards: ShardCount, Observer: obs})
		if err != nil {
			return err
		}
		return g.Run(ctx, func(ctx context.Context, s shard.Shard, gr G) { work(ctx, s, gr) })
	}
}

// shardScenario is one run of the shard scenario.
type shardScenario struct {
	members int
	hold    time.Duration // between fenced writes
	// target is the address of the server behind member slot i's proxy.
	target func(i int) string
	// open dials a session through the proxy and returns the member's
	// runner and the session's Close.
	open func(ctx context.Context, p *embedtest.Proxy) (shardRunner, func(), error)
	// expiry is the store's expiry of a session nobody renews (the victim
	// window of a kill).
	expiry time.Duration
	// pause draws how long a pause-member lasts.
	pause func(rng *rand.Rand) time.Duration

	shards  []*Workload // per shard: its Resource, History and Tracker
	noticed []*faultLog // per shard: grants a fault ended, and takeovers
	faults  *faultLog   // counts and spans of every fault
	slots   []*memberSlot
	ids     atomic.Int64
	cleanup sync.WaitGroup // killed instances winding down

	writes, rejected, grants, lost, sessions, moves atomic.Int64
}

// memberSlot is one member: the instances that run one after another in
// it (a new session each).
type memberSlot struct {
	mu   sync.Mutex
	inst *instance // the running one, nil between two
}

// instance is one run of a member, through its own proxy and session. Its
// ID is its client number in the histories.
type instance struct {
	id    int
	proxy *embedtest.Proxy
	stop  context.CancelCauseFunc
	dead  chan struct{} // closed when killed: the works stop at once
	start time.Duration

	mu      sync.Mutex
	lastEnd map[int]time.Duration // per shard: when its work last returned
	tokens  map[int]holdfast.Token
}

func newShardScenario(members int, start time.Time) *shardScenario {
	r := &shardScenario{members: members, hold: 100 * time.Millisecond}
	for range ShardCount {
		h := &History{start: start}
		r.shards = append(r.shards, &Workload{Resource: NewResource(), History: h, Tracker: &Tracker{Limit: 1}})
		r.noticed = append(r.noticed, &faultLog{h: h})
	}
	r.faults = &faultLog{h: &History{start: start}}
	for range members {
		r.slots = append(r.slots, &memberSlot{})
	}
	return r
}

// now is the scenario's clock, shared by every shard's history.
func (r *shardScenario) now() time.Duration { return r.faults.h.Now() }

// run runs the members until ctx ends, while inject injects faults, and
// waits for every instance to end.
func (r *shardScenario) run(ctx context.Context, inject func(ctx context.Context) error) error {
	var wg sync.WaitGroup
	for i := range r.slots {
		wg.Go(func() { r.member(ctx, i) })
	}
	err := inject(ctx)
	wg.Wait()
	r.cleanup.Wait()
	return err
}

// member runs slot i's instances one after another until ctx ends.
func (r *shardScenario) member(ctx context.Context, i int) {
	slot := r.slots[i]
	for ctx.Err() == nil {
		p, err := embedtest.NewProxy(r.target(i))
		if err != nil {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		run, closeSession, err := r.open(ctx, p)
		if err != nil {
			p.Close()
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		r.sessions.Add(1)
		ictx, stop := context.WithCancelCause(ctx)
		in := &instance{id: int(r.ids.Add(1)), proxy: p, stop: stop, dead: make(chan struct{}), start: r.now(),
			lastEnd: map[int]time.Duration{}, tokens: map[int]holdfast.Token{}}
		slot.mu.Lock()
		slot.inst = in
		slot.mu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = run(ictx, r.work(in), r.observer(in))
		}()
		select {
		case <-done:
		case <-in.dead:
		}
		slot.mu.Lock()
		slot.inst = nil
		slot.mu.Unlock()
		wanted := r.now()
		for _, w := range r.shards {
			w.History.Add(Op{Client: in.id, Kind: Want, Call: in.start, Return: wanted})
		}
		wind := func() {
			<-done
			stop(nil)
			closeSession()
			p.Close()
		}
		select {
		case <-in.dead:
			// Killed: the old instance winds down unseen (its proxy is
			// closed, so its session expires in the store) while the
			// member restarts at once, as a supervisor would. Its session
			// is closed at once (its requests cannot reach the store), so
			// that Run's leave does not wait out its timeout.
			r.cleanup.Go(func() {
				closeSession()
				wind()
			})
		default:
			wind()
			if context.Cause(ictx) == errRestarted {
				sleep(ctx, time.Duration(200+rand.IntN(1000))*time.Millisecond)
			}
		}
	}
}

// work is instance in's work for a shard: it records the grant, then
// writes to the shard's resource every r.hold until its context ends or
// the instance is killed.
func (r *shardScenario) work(in *instance) func(context.Context, shard.Shard, holdfast.Grant) {
	return func(ctx context.Context, s shard.Shard, g holdfast.Grant) {
		w := r.shards[s.Index]
		h := w.History
		ret := h.Now()
		in.mu.Lock()
		call, ok := in.lastEnd[s.Index] // Lock was called after that
		if !ok {
			call = in.start
		}
		in.tokens[s.Index] = g.Token()
		in.mu.Unlock()
		token := g.Token()
		h.Add(Op{Client: in.id, Kind: Acquire, Token: token, OK: true, Call: call, Return: ret})
		r.grants.Add(1)
		w.Tracker.Granted(in.id, g)
		context.AfterFunc(g.Context(), func() {
			at := h.Now()
			h.Add(Op{Client: in.id, Kind: End, Token: token, OK: true, Call: at, Return: at})
			if !errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) {
				r.lost.Add(1)
			}
		})
		t := time.NewTimer(0)
		defer t.Stop()
	writing:
		for {
			select {
			case <-ctx.Done():
				break writing
			case <-in.dead:
				break writing
			case <-t.C:
			}
			call := h.Now()
			err := w.Resource.Write(in.id, token)
			h.Add(Op{Client: in.id, Kind: Put, Token: token, OK: err == nil, Call: call, Return: h.Now()})
			r.writes.Add(1)
			if err != nil {
				r.rejected.Add(1)
			}
			t.Reset(r.hold)
		}
		in.mu.Lock()
		in.lastEnd[s.Index] = h.Now()
		in.mu.Unlock()
	}
}

// shardObserver records instance in's releases.
type shardObserver struct {
	r  *shardScenario
	in *instance
}

func (o shardObserver) ShardAcquired(string, shard.Shard) {}

// ShardReleased records a release of the shard: called from its work's
// return (the group unlocks after that), returned now; OK if the group
// released it as held (not lost).
func (o shardObserver) ShardReleased(_ string, s shard.Shard, cause error) {
	if errors.Is(cause, shard.ErrMoved) {
		o.r.moves.Add(1)
	}
	h := o.r.shards[s.Index].History
	o.in.mu.Lock()
	op := Op{Client: o.in.id, Kind: Release, Token: o.in.tokens[s.Index], OK: !errors.Is(cause, holdfast.ErrLost), Call: o.in.lastEnd[s.Index], Return: h.Now()}
	o.in.mu.Unlock()
	h.Add(op)
}

func (r *shardScenario) observer(in *instance) shard.Observer { return shardObserver{r, in} }

// instanceOf returns slot i's running instance, or nil.
func (r *shardScenario) instanceOf(i int) *instance {
	r.slots[i].mu.Lock()
	defer r.slots[i].mu.Unlock()
	return r.slots[i].inst
}

// victims times, for every shard that slot i's instance holds, the fault
// that cuts it off (see faultLog.victim).
func (r *shardScenario) victims(i int, window time.Duration) {
	in := r.instanceOf(i)
	if in == nil {
		return
	}
	for s, w := range r.shards {
		r.noticed[s].victim(w.History, w.Tracker.Grant(in.id), window)
	}
}

// serverVictims calls victims for the members whose proxy goes to server
// m of servers.
func (r *shardScenario) serverVictims(servers, m int, window time.Duration) {
	for i := range r.slots {
		if i%servers == m {
			r.victims(i, window)
		}
	}
}

// memberFault injects a member fault of kind into a random member, and
// reports whether kind is one.
func (r *shardScenario) memberFault(ctx context.Context, rng *rand.Rand, kind string, logf func(string, ...any)) bool {
	i := rng.IntN(len(r.slots))
	in := r.instanceOf(i)
	switch kind {
	case "kill-member":
		if in == nil || isDone(in.dead) {
			return true
		}
		r.faults.count(kind)
		logf("%s: member %d (client %d)", kind, i, in.id)
		r.victims(i, r.expiry+time.Second)
		in.proxy.Close() // its connections reset, new ones refused
		close(in.dead)
		in.stop(errKilled)
		r.faults.mended() // at once: the process is gone
	case "pause-member":
		if in == nil {
			return true
		}
		d := r.pause(rng)
		r.faults.count(kind)
		logf("%s: member %d (client %d) for %v", kind, i, in.id, d)
		r.victims(i, d+r.expiry)
		in.proxy.Pause()
		sleep(ctx, d)
		in.proxy.Mend()
	case "restart-member":
		if in == nil {
			return true
		}
		r.faults.count(kind)
		logf("%s: member %d (client %d)", kind, i, in.id)
		in.stop(errRestarted)
	default:
		return false
	}
	return true
}

// finish fills s from the run: each shard judged on its own, the findings
// merged (each prefixed with its shard).
func (r *shardScenario) finish(s *Summary, live LivenessBounds) {
	s.Shards = ShardCount
	s.Stats = Stats{Grants: int(r.grants.Load()), Writes: int(r.writes.Load()), Rejected: int(r.rejected.Load()), Lost: int(r.lost.Load()), Sessions: int(r.sessions.Load())}
	s.Moves = int(r.moves.Load())
	s.Linearizable = porcupine.Ok
	r.faults.mu.Lock()
	spans := append([]Fault(nil), r.faults.spans...)
	s.Faults = r.faults.counts
	r.faults.mu.Unlock()
	prefix := func(i int, l []string) []string {
		for j := range l {
			l[j] = fmt.Sprintf("shard %d: %s", i, l[j])
		}
		return l
	}
	for i, w := range r.shards {
		f := r.noticed[i]
		f.mu.Lock()
		f.spans = spans
		f.mu.Unlock()
		var sub Summary
		finish(&sub, w, Stats{}, f, live)
		s.FenceViolations = append(s.FenceViolations, prefix(i, sub.FenceViolations)...)
		s.ToldFirstViolations = append(s.ToldFirstViolations, prefix(i, sub.ToldFirstViolations)...)
		s.ReleaseViolations = append(s.ReleaseViolations, prefix(i, sub.ReleaseViolations)...)
		s.Witnesses = append(s.Witnesses, prefix(i, sub.Witnesses)...)
		s.GrantsChecked += sub.GrantsChecked
		if sub.Linearizable != porcupine.Ok && s.Linearizable != porcupine.Illegal {
			s.Linearizable = sub.Linearizable
		}
		s.Ended += sub.Ended
		s.MaxNotice = max(s.MaxNotice, sub.MaxNotice)
		s.MaxTakeover = max(s.MaxTakeover, sub.MaxTakeover)
		l := &s.Liveness
		l.Gaps += sub.Liveness.Gaps
		l.Sum += sub.Liveness.Sum
		if lg := sub.Liveness.Longest; lg.Len() > l.Longest.Len() {
			l.Longest = lg
			s.LongestShard = i
			s.LongestBetween = ""
			for _, op := range w.History.Ops() {
				switch {
				case (op.Kind == Release || op.Kind == End) && op.Call == lg.From:
					s.LongestBetween += fmt.Sprintf(" after client %d's %v of token %d", op.Client, op.Kind, op.Token)
				case op.Kind == Acquire && op.OK && op.Return == lg.To:
					s.LongestBetween += fmt.Sprintf(" until client %d's grant of token %d", op.Client, op.Token)
				}
			}
		}
		for k, v := range sub.Liveness.ByFault {
			if l.ByFault == nil {
				l.ByFault = map[string]time.Duration{}
			}
			l.ByFault[k] += v
		}
		for _, v := range sub.Liveness.Violations {
			v.Fault = fmt.Sprintf("shard %d, %s", i, v.Fault)
			l.Violations = append(l.Violations, v)
		}
	}
}

// lastMember runs one member of the group alone through run until it owns
// every shard (pruning what dead members left), then leaves.
func lastMember(ctx context.Context, run shardRunner) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var owned atomic.Int32
	all := make(chan struct{})
	var once sync.Once
	rctx, leave := context.WithCancel(ctx)
	defer leave()
	go func() {
		select {
		case <-all:
		case <-ctx.Done():
		}
		leave()
	}()
	err := run(rctx, func(ctx context.Context, _ shard.Shard, _ holdfast.Grant) {
		if owned.Add(1) == ShardCount {
			once.Do(func() { close(all) })
		}
		<-ctx.Done()
	}, nil)
	if err == nil && owned.Load() < ShardCount {
		err = fmt.Errorf("owned %d of %d shards before %w", owned.Load(), ShardCount, ctx.Err())
	}
	return err
}

// runShardEtcd is RunEtcd with the Shard primitive.
func runShardEtcd(ctx context.Context, o EtcdOptions) (Summary, error) {
	kinds, err := faultKinds(o.Faults, EtcdShardFaults)
	if err != nil {
		return Summary{}, err
	}
	logf := logTo(o.Log)
	c, err := etcdtest.StartEtcd("", 3)
	if err != nil {
		return Summary{}, err
	}
	defer c.Close()
	name := fmt.Sprintf("safety/etcd-shard/%d", time.Now().UnixNano())
	r := newShardScenario(o.Clients, time.Now())
	logf = r.timed(logf)
	r.target = func(i int) string {
		u, _ := url.Parse(c.Endpoint(i % c.Size()))
		return u.Host
	}
	r.open = func(ctx context.Context, p *embedtest.Proxy) (shardRunner, func(), error) {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := etcd.Dial(dctx, []string{p.URL()}, etcd.WithTTL(etcd.MinTTL))
		if err != nil {
			return nil, nil, err
		}
		return runnerOf(shard.Etcd(s), name), func() { s.Close() }, nil
	}
	r.expiry = etcd.MinTTL
	r.pause = func(rng *rand.Rand) time.Duration { return time.Duration(1000+rng.IntN(2500)) * time.Millisecond }
	runCtx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	err = r.run(runCtx, func(ctx context.Context) error {
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
		defer r.faults.mended()
		if len(kinds) == 0 { // NoFaults
			<-ctx.Done()
			return nil
		}
		for ctx.Err() == nil {
			r.faults.mended()
			sleep(ctx, 500*time.Millisecond+time.Duration(rng.IntN(1000))*time.Millisecond)
			if ctx.Err() != nil {
				return nil
			}
			kind := kinds[rng.IntN(len(kinds))]
			if r.memberFault(ctx, rng, kind, logf) {
				continue
			}
			leader, err := c.WaitLeader(15 * time.Second)
			if err != nil {
				return err
			}
			d := time.Duration(1000+rng.IntN(2000)) * time.Millisecond
			switch kind {
			case "stop-follower", "stop-leader":
				m := leader
				if kind == "stop-follower" {
					m = (leader + 1 + rng.IntN(c.Size()-1)) % c.Size()
				}
				r.faults.count(kind)
				logf("%s: member %d for %v", kind, m, d)
				r.serverVictims(c.Size(), m, d+etcd.MinTTL)
				if err := c.Stop(m); err != nil {
					return err
				}
				time.Sleep(d)
				if err := c.Restart(m); err != nil {
					return err
				}
			case "cut-leader-peers":
				r.faults.count(kind)
				logf("%s: member %d for %v", kind, leader, d)
				c.CutPeer(leader)
				time.Sleep(d)
				c.MendPeer(leader)
			}
		}
		return nil
	})
	s := Summary{Backend: fmt.Sprintf("etcd (3 members), %s", Shard), Duration: o.Duration}
	r.finish(&s, LivenessBounds{Base: time.Second, Expiry: etcd.MinTTL})
	s.LeftKeys = leftKeysEtcd(c, name)
	return s, err
}

// runShardConsul is RunConsul with the Shard primitive.
func runShardConsul(ctx context.Context, o ConsulOptions) (Summary, error) {
	kinds, err := faultKinds(o.Faults, ConsulShardFaults)
	if err != nil {
		return Summary{}, err
	}
	logf := logTo(o.Log)
	c, err := embedtest.StartConsulCluster(3)
	if err != nil {
		return Summary{}, err
	}
	defer c.Close()
	name := fmt.Sprintf("safety/consul-shard/%d", time.Now().UnixNano())
	dial := func(ctx context.Context, addr string) (shardRunner, func(), error) {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		s, err := consul.Dial(dctx, addr, consul.WithTTL(consul.MinTTL), consul.WithLockDelay(time.Second))
		if err != nil {
			return nil, nil, err
		}
		return runnerOf(shard.Consul(s), name), func() { s.Close() }, nil
	}
	r := newShardScenario(o.Clients, time.Now())
	logf = r.timed(logf)
	r.target = func(i int) string { return c.HTTPAddr(i % c.Size()) }
	r.open = func(ctx context.Context, p *embedtest.Proxy) (shardRunner, func(), error) { return dial(ctx, p.Addr()) }
	r.expiry = 2 * consul.MinTTL
	r.pause = func(rng *rand.Rand) time.Duration { return time.Duration(3000+rng.IntN(10000)) * time.Millisecond }
	runCtx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	err = r.run(runCtx, func(ctx context.Context) error {
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 17))
		defer r.faults.mended()
		if len(kinds) == 0 { // NoFaults
			<-ctx.Done()
			return nil
		}
		for ctx.Err() == nil {
			r.faults.mended()
			sleep(ctx, time.Duration(1000+rng.IntN(2000))*time.Millisecond)
			if ctx.Err() != nil {
				return nil
			}
			kind := kinds[rng.IntN(len(kinds))]
			if r.memberFault(ctx, rng, kind, logf) {
				continue
			}
			leader, err := c.WaitLeader(30 * time.Second)
			if err != nil {
				return err
			}
			m := leader
			if kind == "kill-follower" || kind == "freeze-follower" {
				m = (leader + 1 + rng.IntN(c.Size()-1)) % c.Size()
			}
			r.faults.count(kind)
			switch kind {
			case "kill-leader", "kill-follower":
				d := time.Duration(1000+rng.IntN(3000)) * time.Millisecond
				logf("%s: server %d for %v", kind, m, d)
				r.serverVictims(c.Size(), m, d+consul.MinTTL)
				if err := c.Kill(m); err != nil {
					return err
				}
				sleep(ctx, d)
				if err := c.Restart(m); err != nil {
					return err
				}
			case "freeze-leader", "freeze-follower":
				d := time.Duration(2000+rng.IntN(6000)) * time.Millisecond
				logf("%s: server %d for %v", kind, m, d)
				r.serverVictims(c.Size(), m, d+consul.MinTTL)
				if err := c.Freeze(m); err != nil {
					return err
				}
				sleep(ctx, d)
				if err := c.Thaw(m); err != nil {
					return err
				}
			}
		}
		return nil
	})
	s := Summary{Backend: fmt.Sprintf("consul (3 servers), %s", Shard), Duration: o.Duration}
	r.finish(&s, LivenessBounds{Base: time.Second, Expiry: 2 * consul.MinTTL, LockDelay: time.Second})
	leader, lerr := c.WaitLeader(30 * time.Second)
	if lerr != nil {
		return s, errors.Join(err, lerr)
	}
	cli, aerr := c.NewClient(leader)
	if aerr != nil {
		return s, errors.Join(err, aerr)
	}
	// Killed and paused members' sessions expire within twice the TTL; then
	// a last member, alone, locks every shard (pruning the dead entries)
	// and drops the dead members' keys, and leaves.
	for deadline := time.Now().Add(3 * consul.MinTTL); time.Now().Before(deadline); {
		if ss, _, lerr := cli.Session().List(nil); lerr == nil && len(ss) == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	run, closeSession, derr := dial(ctx, c.HTTPAddr(leader))
	if derr != nil {
		return s, errors.Join(err, fmt.Errorf("last member: %w", derr))
	}
	if lerr := lastMember(ctx, run); lerr != nil {
		err = errors.Join(err, fmt.Errorf("last member: %w", lerr))
	}
	closeSession()
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

// timed prefixes each line of logf with the scenario's clock.
func (r *shardScenario) timed(logf func(string, ...any)) func(string, ...any) {
	return func(format string, a ...any) {
		logf("%v "+format, append([]any{r.now().Round(time.Millisecond)}, a...)...)
	}
}

// logTo returns a printf to w, or to nowhere if w is nil.
func logTo(w io.Writer) func(string, ...any) {
	return func(format string, a ...any) {
		if w != nil {
			fmt.Fprintf(w, format+"\n", a...)
		}
	}
}

// isDone reports whether ch is closed.
func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
