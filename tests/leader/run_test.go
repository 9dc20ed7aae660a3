package leader_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
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
	"github.com/holdfast/holdfast/leader"
)

// fake is a Candidate that never wins, for the validation tests.
type fake struct{}

func (*fake) Name() string { return "fake" }
func (*fake) Campaign(ctx context.Context, _ []byte) (*etcd.Grant, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (*fake) Leader(context.Context) (holdfast.Leader, error) {
	return holdfast.Leader{}, holdfast.ErrNoLeader
}
func (*fake) Observe(ctx context.Context) <-chan holdfast.Leader {
	ch := make(chan holdfast.Leader)
	close(ch)
	return ch
}

func TestConfigValidation(t *testing.T) {
	ok := func(context.Context, *etcd.Grant) {}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		c    leader.Candidate[*etcd.Grant]
		cfg  leader.Config[*etcd.Grant]
		want string
	}{
		{"nil candidate", nil, leader.Config[*etcd.Grant]{OnStartedLeading: ok}, "nil candidate"},
		{"nil *Election", (*etcd.Election)(nil), leader.Config[*etcd.Grant]{OnStartedLeading: ok}, "nil candidate"},
		{"nil OnStartedLeading", &fake{}, leader.Config[*etcd.Grant]{}, "OnStartedLeading is nil"},
		{"negative RetryMin", &fake{}, leader.Config[*etcd.Grant]{OnStartedLeading: ok, RetryMin: -1}, "RetryMin -1ns is negative"},
		{"RetryMax below RetryMin", &fake{}, leader.Config[*etcd.Grant]{OnStartedLeading: ok, RetryMin: time.Second, RetryMax: time.Millisecond}, "RetryMax 1ms is below RetryMin 1s"},
		{"negative ResignTimeout", &fake{}, leader.Config[*etcd.Grant]{OnStartedLeading: ok, ResignTimeout: -time.Second}, "ResignTimeout -1s is negative"},
	} {
		err := leader.Run(ctx, tc.c, tc.cfg)
		if !errors.Is(err, holdfast.ErrInvalidArgument) || !contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidArgument saying %q", tc.name, err, tc.want)
		}
	}
	//lint:ignore SA1012 a nil context is the input under test
	if err := leader.Run(nil, leader.Candidate[*etcd.Grant](&fake{}), leader.Config[*etcd.Grant]{OnStartedLeading: ok}); !errors.Is(err, holdfast.ErrInvalidArgument) { //nolint:staticcheck
		t.Errorf("nil context: %v", err)
	}
	// A valid config runs until ctx ends, and then returns nil.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := leader.Run(cctx, leader.Candidate[*etcd.Grant](&fake{}), leader.Config[*etcd.Grant]{OnStartedLeading: ok}); err != nil {
		t.Errorf("Run until ctx ends: %v", err)
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// store is what the tests need of a backend.
type store[G holdfast.Grant] struct {
	// join opens a session and returns a candidate on name; kill ends the
	// session from outside (lease revoke, session destroy); cut (etcd
	// only) partitions it from the store, so that it expires.
	join func(t *testing.T, name string) (c leader.Candidate[G], kill, cut func())
	// write is a guarded write of the leader's term to the resource key;
	// it returns the store's commit order of the write.
	write func(ctx context.Context, g G, key string) (uint64, error)
	ttl   time.Duration // session TTL
	delay time.Duration // lock-delay after a kill
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

func etcdStore(t *testing.T, ttl time.Duration) store[*etcd.Grant] {
	c := etcdtest.Etcd(t)
	admin := c.Client(t)
	host := func(ep string) string { u, _ := url.Parse(ep); return u.Host }
	return store[*etcd.Grant]{
		ttl: ttl,
		join: func(t *testing.T, name string) (leader.Candidate[*etcd.Grant], func(), func()) {
			p := embedtest.StartProxy(t, host(c.Endpoint(0)))
			cli := c.Client(t, func(cfg *clientv3.Config) { cfg.Endpoints = []string{p.URL()} })
			s, err := etcd.NewSession(context.Background(), cli, etcd.WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Mend(); _ = s.Close() })
			e, err := etcd.NewElection(s, name)
			if err != nil {
				t.Fatal(err)
			}
			kill := func() {
				if _, err := admin.Revoke(context.Background(), s.Lease()); err != nil {
					t.Error(err)
				}
			}
			return e, kill, p.Blackhole
		},
		write: func(ctx context.Context, g *etcd.Grant, key string) (uint64, error) {
			resp, err := g.Txn(ctx, clientv3.OpPut(key, g.Token().String()))
			if err != nil {
				return 0, err
			}
			return uint64(resp.Header.Revision), nil
		},
	}
}

func consulStore(t *testing.T, delay time.Duration) store[*consul.Grant] {
	consulAgent.once.Do(func() { consulAgent.agent, consulAgent.err = embedtest.StartConsul() })
	if consulAgent.err != nil {
		t.Fatal(consulAgent.err)
	}
	a := consulAgent.agent
	admin := a.Client(t)
	return store[*consul.Grant]{
		ttl:   consul.MinTTL,
		delay: delay,
		join: func(t *testing.T, name string) (leader.Candidate[*consul.Grant], func(), func()) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := consul.NewSession(ctx, a.Client(t), consul.WithLockDelay(delay))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			e, err := consul.NewElection(s, name)
			if err != nil {
				t.Fatal(err)
			}
			kill := func() {
				if _, err := admin.Session().Destroy(s.ID(), nil); err != nil {
					t.Error(err)
				}
			}
			return e, kill, nil
		},
		write: func(ctx context.Context, g *consul.Grant, key string) (uint64, error) {
			resp, err := g.Txn(ctx, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: key, Value: []byte(g.Token().String())}}})
			if err != nil {
				return 0, err
			}
			return resp.Results[0].KV.ModifyIndex, nil
		},
	}
}

var seq atomic.Int64

// uniq returns a fresh election name.
func uniq(t *testing.T) string {
	return fmt.Sprintf("leader-test/%s/%d-%d", t.Name(), time.Now().UnixNano()%1e6, seq.Add(1))
}

// journal records what the leaders did, in order.
type journal struct {
	mu      sync.Mutex
	events  []event          // starts and ends of terms, in the order they happened
	starts  []holdfast.Token // terms, in order of OnStartedLeading
	writes  []write          // committed guarded writes
	refused int              // guarded writes started under a live leadership context, refused
	started chan started
}

type event struct {
	start bool
	term  holdfast.Token
	at    time.Time
}

type started struct {
	member int
	term   holdfast.Token
	at     time.Time
}

type write struct {
	order uint64
	term  holdfast.Token
}

func newJournal() *journal { return &journal{started: make(chan started, 1024)} }

func (j *journal) log(e event) {
	j.mu.Lock()
	j.events = append(j.events, e)
	j.mu.Unlock()
}

// run starts leader.Run for c as member m; its OnStartedLeading writes the
// term to key under the leadership until it ends (or, if writes > 0, for
// that many writes, then returns, which resigns). It returns a channel
// that gets Run's error.
func run[G holdfast.Grant](ctx context.Context, st store[G], c leader.Candidate[G], j *journal, m int, key string, writes int) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- leader.Run(ctx, c, leader.Config[G]{
			Value: fmt.Appendf(nil, "member-%d", m),
			OnStartedLeading: func(lctx context.Context, g G) {
				context.AfterFunc(g.Context(), func() { j.log(event{false, g.Token(), time.Now()}) })
				now := time.Now()
				j.log(event{true, g.Token(), now})
				j.mu.Lock()
				j.starts = append(j.starts, g.Token())
				j.mu.Unlock()
				j.started <- started{m, g.Token(), now}
				for i := 0; writes == 0 || i < writes; i++ {
					if lctx.Err() != nil {
						return
					}
					order, err := st.write(lctx, g, key)
					j.mu.Lock()
					if err == nil {
						j.writes = append(j.writes, write{order, g.Token()})
					} else if errors.Is(err, holdfast.ErrNotHeld) {
						j.refused++ // started while its context was alive, refused by the store's guard
					}
					j.mu.Unlock()
					time.Sleep(time.Millisecond)
				}
			},
			ResignOnCancel: true,
		})
	}()
	return done
}

// check verifies the journal: terms strictly increase in order of start,
// and no committed write has a lower term than one committed before it.
// With toldFirst, every term also ended before the next one started.
func (j *journal) check(t *testing.T, toldFirst bool) {
	t.Helper()
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := 1; i < len(j.starts); i++ {
		if j.starts[i] <= j.starts[i-1] {
			t.Errorf("terms do not increase: %v", j.starts)
			break
		}
	}
	ws := slices.Clone(j.writes)
	slices.SortFunc(ws, func(a, b write) int { return cmp.Compare(a.order, b.order) })
	double := 0
	var top holdfast.Token
	for _, w := range ws {
		if w.term < top {
			double++
		}
		top = max(top, w.term)
	}
	if double > 0 {
		t.Errorf("%d writes committed by a leader after a newer leader had written", double)
	}
	if toldFirst {
		live := map[holdfast.Token]bool{}
		for _, e := range j.events {
			if !e.start {
				delete(live, e.term)
				continue
			}
			if len(live) > 0 {
				t.Errorf("term %d started while %v still had a live context", e.term, live)
			}
			live[e.term] = true
		}
	}
	t.Logf("%d terms, %d guarded writes committed (%d of them after a newer leader's), %d refused (started by a leader that had not noticed its loss yet)", len(j.starts), len(ws), double, j.refused)
}

// manyFailovers runs 3 candidates on one name and forces n failovers by
// killing the leader's session from outside; each killed candidate is
// replaced by a new one.
func manyFailovers[G holdfast.Grant](t *testing.T, st store[G], n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	name, key := uniq(t), "resource/"+uniq(t)
	j := newJournal()
	type member struct {
		kill func()
		done <-chan error
	}
	members := make([]member, 3)
	join := func(i int) {
		c, kill, _ := st.join(t, name)
		members[i] = member{kill: kill, done: run(ctx, st, c, j, i, key, 0)}
	}
	for i := range members {
		join(i)
	}
	begin := time.Now()
	var failovers []time.Duration
	cur := <-j.started
	for k := 0; k < n; k++ {
		time.Sleep(2 * time.Millisecond) // let it write
		killed := time.Now()
		members[cur.member].kill()
		var next started
		select {
		case next = <-j.started:
		case <-ctx.Done():
			t.Fatalf("no leader after %d failovers", k)
		}
		failovers = append(failovers, next.at.Sub(killed))
		if err := <-members[cur.member].done; !errors.Is(err, holdfast.ErrSessionLost) {
			t.Fatalf("Run of a killed session: %v", err)
		}
		join(cur.member)
		cur = next
	}
	slices.Sort(failovers)
	t.Logf("%d forced failovers in %v; failover after the kill: median %v, max %v", n, time.Since(begin).Round(time.Millisecond), failovers[len(failovers)/2], failovers[len(failovers)-1])
	cancel()
	for _, m := range members {
		if err := <-m.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	j.check(t, false)
}

func TestManyFailoversEtcd(t *testing.T) {
	manyFailovers(t, etcdStore(t, etcd.MinTTL), 200)
}

func TestManyFailoversConsul(t *testing.T) {
	manyFailovers(t, consulStore(t, 0), 200)
}

// toldFirst: connected leaders that resign (their OnStartedLeading returns)
// and a leader that is cut off (etcd: partitioned until its lease expires;
// Consul: its session destroyed, with a lock-delay) all have their context
// cancelled before the next leader's OnStartedLeading; the failover after
// the cut is within bound. OnNewLeader sees the terms in order.
func toldFirst[G holdfast.Grant](t *testing.T, st store[G], bound time.Duration, every bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name, key := uniq(t), "resource/"+uniq(t)
	j := newJournal()
	var dones []<-chan error
	var cuts []func()
	for i := range 3 {
		c, kill, cut := st.join(t, name)
		if cut == nil {
			cut = kill
		}
		cuts = append(cuts, cut)
		writes := 5 // then resign
		if i == 0 {
			writes = 0 // lead until cut off
		}
		dones = append(dones, run(ctx, st, c, j, i, key, writes))
		if i == 0 {
			<-j.started // member 0 leads first
		}
	}
	// The observer is a candidate too (leader.Run campaigns): it joins the
	// queue after the others, so that it would lead only after them.
	time.Sleep(300 * time.Millisecond)
	var observed []holdfast.Leader
	var omu sync.Mutex
	oc, _, _ := st.join(t, name)
	odone := make(chan error, 1)
	octx, ostop := context.WithCancel(ctx)
	go func() {
		odone <- leader.Run(octx, oc, leader.Config[G]{
			OnStartedLeading: func(ctx context.Context, g G) { <-ctx.Done() },
			OnNewLeader: func(l holdfast.Leader) {
				omu.Lock()
				observed = append(observed, l)
				omu.Unlock()
			},
		})
	}()
	time.Sleep(300 * time.Millisecond) // the observer queues behind the others
	cutAt := time.Now()
	cuts[0]()
	next := <-j.started
	took := next.at.Sub(cutAt)
	t.Logf("failover after the cut: %v (bound %v)", took, bound)
	if took > bound {
		t.Errorf("failover took %v, more than %v", took, bound)
	}
	<-j.started // the third member, after the second resigned
	time.Sleep(200 * time.Millisecond)
	cancel()
	ostop()
	for _, d := range dones[1:] {
		if err := <-d; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	<-odone
	j.check(t, true)
	omu.Lock()
	defer omu.Unlock()
	var terms []holdfast.Token
	for _, l := range observed {
		if !l.None() {
			terms = append(terms, l.Term)
		}
	}
	j.mu.Lock()
	starts := slices.Clone(j.starts)
	j.mu.Unlock()
	if len(terms) > len(starts) {
		terms = terms[:len(starts)] // then the observer's own term
	}
	if every && !slices.Equal(terms, starts) {
		t.Errorf("OnNewLeader saw terms %v, leaders were %v", terms, starts)
	}
	if !every && !slices.IsSorted(terms) {
		t.Errorf("OnNewLeader saw terms out of order: %v", terms)
	}
}

// TestToldFirstEtcd: the failover after the leader is cut off is at most
// TTL after its last keepalive, plus up to 500 ms (etcd revokes expired
// leases on a 500 ms tick), so within TTL + 0.5 s of the cut; the assertion
// allows 0.5 s more for a loaded machine (the figure is logged).
func TestToldFirstEtcd(t *testing.T) {
	ttl := etcd.MinTTL
	toldFirst(t, etcdStore(t, ttl), ttl+time.Second, true)
}

func TestToldFirstConsul(t *testing.T) {
	delay := 300 * time.Millisecond
	toldFirst(t, consulStore(t, delay), delay+500*time.Millisecond, false)
}
