package shard_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/shard"
)

// store is one backend under test.
type store[G holdfast.Grant] struct {
	// join returns a new member's Store, through a fault proxy of its
	// own (p), and kill, which ends its session in the store at once.
	join func(t *testing.T) (s *shard.Store[G], p *embedtest.Proxy, kill func())
	// read returns the counter at key (0 if absent), read linearizably.
	read func(ctx context.Context, key string) (int, error)
	// write sets the counter at key to v under g's guard.
	write func(ctx context.Context, g G, key string, v int) error
	// ttl is the sessions' TTL, delay their lock-delay.
	ttl, delay time.Duration
	// lock holds a lock called name until t ends.
	lock func(t *testing.T, name string)
	// native is the store's own lock command (etcdctl lock, consul lock)
	// on name, running the shell script script, not started.
	native func(t *testing.T, name, script string) *exec.Cmd
}

var consulAgent struct {
	once  sync.Once
	agent *embedtest.ConsulAgent
	err   error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if consulAgent.agent != nil {
		consulAgent.agent.Close()
	}
	os.Exit(code)
}

// etcdStore's sessions have TTL ttl: etcd.MinTTL where the test waits for
// an expiry, longer where it does not (8 members in one process under
// -race on a loaded machine can miss a 2 s TTL's renewals).
func etcdStore(t *testing.T, ttl time.Duration) store[*etcd.Grant] {
	c := etcdtest.Etcd(t)
	admin := c.Client(t)
	host := func(ep string) string { u, _ := url.Parse(ep); return u.Host }
	return store[*etcd.Grant]{
		ttl: ttl,
		join: func(t *testing.T) (*shard.Store[*etcd.Grant], *embedtest.Proxy, func()) {
			p := embedtest.StartProxy(t, host(c.Endpoint(0)))
			cli := c.Client(t, func(cfg *clientv3.Config) { cfg.Endpoints = []string{p.URL()} })
			s, err := etcd.NewSession(context.Background(), cli, etcd.WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Mend(); _ = s.Close() })
			kill := func() {
				if _, err := admin.Revoke(context.Background(), s.Lease()); err != nil {
					t.Error(err)
				}
			}
			return shard.Etcd(s), p, kill
		},
		read: func(ctx context.Context, key string) (int, error) {
			resp, err := admin.Get(ctx, key)
			if err != nil || len(resp.Kvs) == 0 {
				return 0, err
			}
			return strconv.Atoi(string(resp.Kvs[0].Value))
		},
		write: func(ctx context.Context, g *etcd.Grant, key string, v int) error {
			_, err := g.Txn(ctx, clientv3.OpPut(key, strconv.Itoa(v)))
			return err
		},
		native: func(t *testing.T, name, script string) *exec.Cmd {
			cmd := exec.Command("etcdctl", "--endpoints", c.Endpoints()[0], "lock", name, "--", "sh", "-c", script)
			cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
			return cmd
		},
		lock: func(t *testing.T, name string) {
			s, err := etcd.NewSession(context.Background(), admin)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			m, err := etcd.NewMutex(s, name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Lock(context.Background()); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func consulStore(t *testing.T) store[*consul.Grant] {
	consulAgent.once.Do(func() { consulAgent.agent, consulAgent.err = embedtest.StartConsul() })
	if consulAgent.err != nil {
		t.Fatal(consulAgent.err)
	}
	a := consulAgent.agent
	admin := a.Client(t)
	delay := 500 * time.Millisecond
	return store[*consul.Grant]{
		ttl:   consul.MinTTL,
		delay: delay,
		join: func(t *testing.T) (*shard.Store[*consul.Grant], *embedtest.Proxy, func()) {
			p := embedtest.StartProxy(t, a.HTTPAddr)
			cli, err := a.NewClient(func(cfg *api.Config) { cfg.Address = p.Addr() })
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := consul.NewSession(ctx, cli, consul.WithLockDelay(delay))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Mend(); _ = s.Close() })
			kill := func() {
				if _, err := admin.Session().Destroy(s.ID(), nil); err != nil {
					t.Error(err)
				}
			}
			return shard.Consul(s), p, kill
		},
		native: func(t *testing.T, name, script string) *exec.Cmd {
			bin, err := embedtest.ConsulBinary()
			if err != nil {
				t.Fatal(err)
			}
			return exec.Command(bin, "lock", "-http-addr="+a.HTTPAddr, name, script)
		},
		read: func(ctx context.Context, key string) (int, error) {
			kv, _, err := admin.KV().Get(key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
			if err != nil || kv == nil {
				return 0, err
			}
			return strconv.Atoi(string(kv.Value))
		},
		write: func(ctx context.Context, g *consul.Grant, key string, v int) error {
			_, err := g.Txn(ctx, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: key, Value: []byte(strconv.Itoa(v))}}})
			return err
		},
	}
}

var seq atomic.Int64

// uniq returns a fresh group name.
func uniq(t *testing.T) string {
	return fmt.Sprintf("shard-test/%s/%d-%d", t.Name(), time.Now().UnixNano()%1e6, seq.Add(1))
}

// span is one work's time on a shard: from its start to the end of its
// context (when the member was told).
type span struct {
	member     int
	token      holdfast.Token
	start, end time.Time
}

// fleet runs members of one group and records what their works did.
type fleet[G holdfast.Grant] struct {
	t       *testing.T
	st      store[G]
	name    string
	n       int
	members []*member[G]

	mu    sync.Mutex
	spans map[int][]*span // by shard
	ok    []int           // guarded increments the store confirmed, by shard
	maybe []int           // guarded increments of unknown outcome (a timeout), by shard
	// killed members' sessions ended in the store before they could be
	// told: their works are not held to "told first".
	killed map[int]bool
}

type member[G holdfast.Grant] struct {
	s      *shard.Store[G]
	g      *shard.Group[G]
	p      *embedtest.Proxy
	kill   func()
	cancel context.CancelFunc
	done   chan error
	gone   bool // killed or cut: not counted in the balance
}

func newFleet[G holdfast.Grant](t *testing.T, st store[G], n int) *fleet[G] {
	return &fleet[G]{t: t, st: st, name: uniq(t), n: n, spans: map[int][]*span{}, ok: make([]int, n), maybe: make([]int, n), killed: map[int]bool{}}
}

func (f *fleet[G]) dataKey(s shard.Shard) string { return "shard-data/" + f.name + "/" + s.Name }

// add starts one more member.
func (f *fleet[G]) add() *member[G] {
	t := f.t
	s, p, kill := f.st.join(t)
	g, err := shard.New(s, f.name, shard.Config{Shards: f.n, Member: fmt.Sprintf("m%d", len(f.members)), DrainTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member[G]{s: s, g: g, p: p, kill: kill, cancel: cancel, done: make(chan error, 1)}
	idx := len(f.members)
	f.members = append(f.members, m)
	go func() {
		m.done <- g.Run(ctx, func(ctx context.Context, s shard.Shard, gr G) { f.work(ctx, idx, s, gr) })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-m.done:
		case <-time.After(20 * time.Second):
			t.Errorf("member %d: Run did not return", idx)
		}
	})
	return m
}

// work increments the shard's counter under the grant every few ms until
// ctx ends: read once, then guarded writes of the next value, each with a
// bound of its own (not ctx: a write whose outcome is unknown would make
// the count inexact).
func (f *fleet[G]) work(ctx context.Context, m int, s shard.Shard, gr G) {
	sp := &span{member: m, token: gr.Token(), start: time.Now()}
	f.mu.Lock()
	f.spans[s.Index] = append(f.spans[s.Index], sp)
	f.mu.Unlock()
	context.AfterFunc(ctx, func() {
		f.mu.Lock()
		sp.end = time.Now()
		f.mu.Unlock()
	})
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	v, err := f.st.read(rctx, f.dataKey(s))
	cancel()
	if err != nil {
		return
	}
	for ctx.Err() == nil {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err := f.st.write(wctx, gr, f.dataKey(s), v+1)
		cancel()
		if err != nil {
			if !errors.Is(err, holdfast.ErrNotHeld) { // may have committed
				f.mu.Lock()
				f.maybe[s.Index]++
				f.mu.Unlock()
			}
			return
		}
		v++
		f.mu.Lock()
		f.ok[s.Index]++
		f.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
}

// owners returns each shard's owner among the live members (-1: none),
// and fails t if two members own a shard at once.
func (f *fleet[G]) owners() []int {
	own := make([]int, f.n)
	for i := range own {
		own[i] = -1
	}
	for mi, m := range f.members {
		if m.gone {
			continue
		}
		for _, s := range m.g.Owned() {
			if own[s.Index] >= 0 {
				f.t.Errorf("shard %d owned by members %d and %d", s.Index, own[s.Index], mi)
			}
			own[s.Index] = mi
		}
	}
	return own
}

// balanced reports whether every shard is owned, each live member owning
// floor(N/M) or ceil(N/M).
func (f *fleet[G]) balanced(own []int) bool {
	load := map[int]int{}
	for _, o := range own {
		if o < 0 {
			return false
		}
		load[o]++
	}
	live := 0
	for _, m := range f.members {
		if !m.gone {
			live++
		}
	}
	lo, hi := f.n/live, (f.n+live-1)/live
	for mi, m := range f.members {
		if !m.gone && (load[mi] < lo || load[mi] > hi) {
			return false
		}
	}
	return true
}

// start starts k members together and waits until the shards are balanced.
func (f *fleet[G]) start(k int) ([]int, time.Duration) {
	start := time.Now()
	for range k {
		f.add()
	}
	return f.settle(start, 15*time.Second)
}

// settle waits until the shards are balanced (within limit) and returns
// the owners and the time it took.
func (f *fleet[G]) settle(since time.Time, limit time.Duration) ([]int, time.Duration) {
	f.t.Helper()
	for {
		own := f.owners()
		if f.balanced(own) {
			return own, time.Since(since)
		}
		for mi, m := range f.members {
			if m.gone {
				continue
			}
			select {
			case err := <-m.done:
				m.done <- err
				f.t.Fatalf("member %d: Run returned early: %v", mi, err)
			default:
			}
		}
		if time.Since(since) > limit {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			st, err := f.members[0].s.Inspect(ctx, f.name)
			cancel()
			if err == nil {
				for _, ss := range st.Shards {
					if own[ss.Shard.Index] < 0 {
						f.t.Logf("shard %d: owner %q token %d waiters %q", ss.Shard.Index, ss.Owner, ss.Token, ss.Waiters)
					}
				}
				f.t.Logf("members %+v", st.Members)
			} else {
				f.t.Logf("inspect: %v", err)
			}
			f.t.Fatalf("not balanced after %v: owners %v", limit, own)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// check verifies the store's counters against the confirmed increments
// (a stale write that committed would make them differ), that each shard's
// tokens increase from owner to owner, and that no work started on a
// shard before the previous owner's work was told to stop.
func (f *fleet[G]) check() {
	t := f.t
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.n {
		s := shard.Shard{Index: i, Name: strconv.Itoa(i)}
		v, err := f.st.read(ctx, f.dataKey(s))
		if err != nil {
			t.Fatal(err)
		}
		if v < f.ok[i] || v > f.ok[i]+f.maybe[i] {
			t.Errorf("shard %d: counter %d in the store, %d increments confirmed, %d of unknown outcome", i, v, f.ok[i], f.maybe[i])
		}
		spans := f.spans[i]
		for j := 1; j < len(spans); j++ {
			a, b := spans[j-1], spans[j]
			if b.token <= a.token {
				t.Errorf("shard %d: token %d after %d", i, b.token, a.token)
			}
			if !f.killed[a.member] && (a.end.IsZero() || a.end.After(b.start)) {
				t.Errorf("shard %d: member %d started (token %d) before member %d was told to stop (token %d, told %v)", i, b.member, b.token, a.member, a.token, a.end)
			}
		}
	}
}

func moved(a, b []int) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

func TestEightBy64Etcd(t *testing.T) { eightBy64(t, etcdStore(t, 5*time.Second), 8, 64) }

// TestEightBy64Consul runs the same steps on Consul, members started
// together: a Lock given up as its shard is assigned elsewhere once left the
// lock key held by the member's session, and the session's next Lock of the
// shard waited for ever (fixed in consul/queue.go, TestLateHandoffRelocked).
func TestEightBy64Consul(t *testing.T) { eightBy64(t, consulStore(t), 8, 64) }

// eightBy64: 8 members x 64 shards balance from a cold start; a ninth
// joins and moves about 64/9 shards; one member is killed and its shards
// are owned again within its session's expiry + lock-delay + 1 s; a
// graceful leave hands its shards over within milliseconds.
func eightBy64[G holdfast.Grant](t *testing.T, st store[G], members, n int) {
	f := newFleet(t, st, n)
	own, took := f.start(members)
	t.Logf("cold start: %d shards balanced over %d members in %v", n, members, took.Round(time.Millisecond))
	for mi := range f.members {
		if c := count(own, mi); c != n/members {
			t.Errorf("member %d owns %d shards, want %d", mi, c, n/members)
		}
	}

	// Inspect: every member listed, every shard owned by the member that
	// runs its work, with its token, and nobody waiting (a member waits
	// only for the shards assigned to it).
	ictx, icancel := context.WithTimeout(context.Background(), 30*time.Second)
	gs, err := f.members[0].s.Inspect(ictx, f.name)
	icancel()
	if err != nil {
		t.Fatal(err)
	}
	if len(gs.Members) != members || len(gs.Shards) != n {
		t.Errorf("Inspect: %d members, %d shards, want %d, %d", len(gs.Members), len(gs.Shards), members, n)
	}
	for _, ss := range gs.Shards {
		if ss.Owner == "" || ss.Token == 0 || len(ss.Waiters) > 0 {
			t.Errorf("Inspect: shard %s: owner %q token %d waiters %q", ss.Shard.Name, ss.Owner, ss.Token, ss.Waiters)
		}
	}
	for _, m := range gs.Members {
		if m.Shards != n/members {
			t.Errorf("Inspect: member %s (%s) owns %d shards, want %d", m.ID, m.Name, m.Shards, n/members)
		}
	}

	// A ninth member joins.
	start := time.Now()
	f.add()
	after, took := f.settle(start, 10*time.Second)
	mv := moved(own, after)
	t.Logf("join: %d shards moved, settled in %v", mv, took.Round(time.Millisecond))
	// Measured 100-400 ms (1.9 s at load 11 under -race); the bound is
	// below the sessions' TTL, so a shard freed only by an expiry fails it.
	if took > 3*time.Second {
		t.Errorf("join: settled in %v, want within 3 s", took)
	}
	m1 := members + 1
	if mv > 2*((n+m1-1)/m1) {
		t.Errorf("join moved %d shards, want at most %d", mv, 2*((n+m1-1)/m1))
	}
	if mv < n/m1 {
		t.Errorf("join moved %d shards, want at least %d", mv, n/m1)
	}

	// A graceful leave.
	leaver := f.members[2]
	start = time.Now()
	leaver.cancel()
	if err := <-leaver.done; err != nil {
		t.Errorf("leave: Run: %v", err)
	}
	leaver.gone = true
	leaver.done <- nil // for the cleanup
	own, took = f.settle(start, 10*time.Second)
	t.Logf("leave: %d shards moved, settled in %v", moved(after, own), took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Errorf("leave: settled in %v, want within 3 s", took)
	}

	// A kill: the store ends the member's session at once.
	victim := f.members[members-1]
	f.mu.Lock()
	f.killed[members-1] = true
	f.mu.Unlock()
	start = time.Now()
	victim.kill()
	victim.gone = true
	bound := st.delay + time.Second
	_, took = f.settle(start, bound+5*time.Second)
	t.Logf("kill: shards owned again in %v (bound %v)", took.Round(time.Millisecond), bound)
	if took > bound+time.Second { // 1 s more for a loaded machine (-race, 2 cores)
		t.Errorf("kill: shards owned again in %v, bound %v", took, bound)
	}
	if err := <-victim.done; !errors.Is(err, holdfast.ErrSessionLost) {
		t.Errorf("killed member's Run: %v, want ErrSessionLost", err)
	}
	victim.done <- nil
	f.stop()
	f.check()
}

// stop ends every member's Run.
func (f *fleet[G]) stop() {
	for i, m := range f.members {
		m.cancel()
		if err := <-m.done; err != nil && !m.gone {
			f.t.Errorf("member %d: Run: %v", i, err)
		}
		m.done <- nil
	}
}

func count(own []int, m int) int {
	c := 0
	for _, o := range own {
		if o == m {
			c++
		}
	}
	return c
}

func TestPauseEtcd(t *testing.T)   { pause(t, etcdStore(t, etcd.MinTTL)) }
func TestPauseConsul(t *testing.T) { pause(t, consulStore(t)) }

// pause: a member frozen (its traffic held by the proxy, as a paused
// process's would be) past its TTL is told first (every work's context
// ends before another member starts on its shards), its shards are owned
// again within the store's expiry of its session + lock-delay + 1 s, and
// the writes it had in flight, delivered when it wakes, are refused (the
// counters stay exact).
//
// On Consul the store may wait up to 2 x TTL before it ends the session;
// the test ends it (Destroy) once the member has been told, which is the
// moment that matters, to save the wait.
func pause[G holdfast.Grant](t *testing.T, st store[G]) {
	const n = 16
	f := newFleet(t, st, n)
	f.start(4)
	x := f.members[1]
	start := time.Now()
	x.p.Pause()
	x.gone = true
	told := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, spans := range f.spans {
			for _, sp := range spans {
				if sp.member == 1 && sp.end.IsZero() {
					return false
				}
			}
		}
		return true
	}
	bound := st.ttl + 500*time.Millisecond + st.delay + time.Second
	if st.delay > 0 { // Consul: wait for the member to be told, then expire it
		for !told() {
			if time.Since(start) > 2*st.ttl {
				t.Fatal("the paused member was not told within 2 x TTL")
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("paused member told after %v", time.Since(start).Round(time.Millisecond))
		start = time.Now()
		x.kill()
		bound = st.delay + time.Second
	}
	_, took := f.settle(start, bound+5*time.Second)
	t.Logf("shards owned again %v after the pause (bound %v)", took.Round(time.Millisecond), bound)
	if took > bound+time.Second { // 1 s more for a loaded machine (-race, 2 cores)
		t.Errorf("shards owned again %v after the pause, bound %v", took, bound)
	}
	if !told() {
		t.Error("the paused member's works were not told when their shards were owned again")
	}
	x.p.Mend()
	if err := <-x.done; !errors.Is(err, holdfast.ErrSessionLost) {
		t.Errorf("paused member's Run: %v, want ErrSessionLost", err)
	}
	x.done <- nil
	time.Sleep(200 * time.Millisecond) // the late writes reach the store
	f.stop()
	f.check()
}

func TestConfigEtcd(t *testing.T) {
	st := etcdStore(t, 5*time.Second)
	s, _, _ := st.join(t)
	bad := []struct {
		name string
		cfg  shard.Config
	}{
		{"g", shard.Config{}},
		{"g", shard.Config{Shards: -1}},
		{"g", shard.Config{Shards: shard.MaxShards + 1}},
		{"g", shard.Config{Shards: 100_000_000}},
		{"", shard.Config{Shards: 4}},
		{"g/.x", shard.Config{Shards: 4}},
		{"g", shard.Config{Names: []string{}}},
		{"g", shard.Config{Names: []string{"a", "a"}}},
		{"g", shard.Config{Names: []string{"a/b"}}},
		{"g", shard.Config{Names: []string{".a"}}},
		{"g", shard.Config{Shards: 3, Names: []string{"a"}}},
		{"g", shard.Config{Shards: 3, DrainTimeout: -1}},
		{"g", shard.Config{Shards: 3, RetryMin: time.Second, RetryMax: time.Millisecond}},
	}
	for _, tc := range bad {
		if _, err := shard.New(s, tc.name, tc.cfg); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("New(%q, %+v): %v, want ErrInvalidArgument", tc.name, tc.cfg, err)
		}
	}
	if _, err := shard.New[*etcd.Grant](nil, "g", shard.Config{Shards: 1}); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("nil store: %v", err)
	}

	// A second Run of the same member: the same Group, or another Group
	// of the same name on the same session, is refused before any request.
	name := uniq(t)
	g, err := shard.New(s, name, shard.Config{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- g.Run(ctx, func(ctx context.Context, s shard.Shard, _ *etcd.Grant) {
			if s.Index == 0 {
				close(started)
			}
			<-ctx.Done()
		})
	}()
	<-started
	work := func(context.Context, shard.Shard, *etcd.Grant) {}
	if err := g.Run(ctx, work); !errors.Is(err, shard.ErrMemberRunning) || !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("second Run: %v, want ErrMemberRunning", err)
	}
	g2, _ := shard.New(s, name, shard.Config{Shards: 4})
	if err := g2.Run(ctx, work); !errors.Is(err, shard.ErrMemberRunning) {
		t.Errorf("Run of a second Group on the same session: %v, want ErrMemberRunning", err)
	}
	// Another member with other shards is a conflict.
	s2, _, _ := st.join(t)
	g3, _ := shard.New(s2, name, shard.Config{Shards: 5})
	if err := g3.Run(ctx, work); !errors.Is(err, holdfast.ErrConflict) {
		t.Errorf("Run with 5 shards beside 4: %v, want ErrConflict", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	//lint:ignore SA1012 a nil context is the input under test
	if err := g.Run(nil, work); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("nil ctx: %v", err)
	}

	// A group named like a held lock is a conflict.
	lockName := uniq(t)
	st.lock(t, lockName)
	g4, _ := shard.New(s, lockName, shard.Config{Shards: 2})
	if err := g4.Run(context.Background(), work); !errors.Is(err, holdfast.ErrConflict) {
		t.Errorf("Run on a lock's name: %v, want ErrConflict", err)
	}
}

// TestLeaveDrainsEtcd: cancelling Run deletes the member's key first (the
// other member queues for its shards while they drain), releases each shard
// only once its work has returned, and the other member's work starts
// within milliseconds of that return (no overlap, no gap).
func TestLeaveDrainsEtcd(t *testing.T) {
	st := etcdStore(t, 5*time.Second)
	name := uniq(t)
	const drain = 300 * time.Millisecond
	var mu sync.Mutex
	returned := map[int]time.Time{} // shard -> when A's work returned
	started := map[int]time.Time{}  // shard -> when B's work started
	sa, _, _ := st.join(t)
	a, _ := shard.New(sa, name, shard.Config{Shards: 2})
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan error, 1)
	go func() {
		adone <- a.Run(actx, func(ctx context.Context, s shard.Shard, _ *etcd.Grant) {
			<-ctx.Done()
			time.Sleep(drain) // a slow drain
			mu.Lock()
			returned[s.Index] = time.Now()
			mu.Unlock()
		})
	}()
	for len(a.Owned()) != 2 {
		time.Sleep(5 * time.Millisecond)
	}
	sb, _, _ := st.join(t)
	b, _ := shard.New(sb, name, shard.Config{Shards: 2})
	bctx, bcancel := context.WithCancel(context.Background())
	defer bcancel()
	bdone := make(chan error, 1)
	go func() {
		bdone <- b.Run(bctx, func(ctx context.Context, s shard.Shard, _ *etcd.Grant) {
			mu.Lock()
			started[s.Index] = time.Now()
			mu.Unlock()
			<-ctx.Done()
		})
	}()
	// B takes one shard from A (2 members, 2 shards); then A leaves.
	for len(b.Owned()) != 1 || len(a.Owned()) != 1 {
		time.Sleep(5 * time.Millisecond)
	}
	kept := a.Owned()[0].Index
	left := time.Now()
	acancel()
	// A's key goes before its work returns.
	var gone time.Time
	for gone.IsZero() && time.Since(left) < drain {
		gs, err := sb.Inspect(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if len(gs.Members) == 1 {
			gone = time.Now()
		}
	}
	if err := <-adone; err != nil {
		t.Fatal(err)
	}
	// B's work on A's shard has started (Owned lists a shard once its
	// work is launched, maybe before the function's first line ran).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		ok := !started[kept].IsZero()
		mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B's work on shard %d had not started 5 s after A's returned", kept)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if gone.IsZero() {
		t.Errorf("A's member key was still there %v after the leave, while its work drained", drain)
	}
	gap := started[kept].Sub(returned[kept])
	t.Logf("leave: key gone after %v; shard %d: A's work returned %v after the leave, B's started %v later", gone.Sub(left).Round(time.Millisecond), kept, returned[kept].Sub(left).Round(time.Millisecond), gap.Round(time.Microsecond))
	if gap < 0 || gap > 200*time.Millisecond {
		t.Errorf("B's work started %v after A's returned, want within 200 ms and not before", gap)
	}
}
