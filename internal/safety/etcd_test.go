package safety

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// faultCounts counts injected faults by kind.
type faultCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *faultCounts) add(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[kind]++
}

func (f *faultCounts) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for k, v := range f.n {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// duration is how long each scenario runs: short in the README's test
// command, longer with HOLDFAST_SAFETY_DURATION (a Go duration).
func duration(t *testing.T) time.Duration {
	if s := os.Getenv("HOLDFAST_SAFETY_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("HOLDFAST_SAFETY_DURATION=%q: %v", s, err)
		}
		return d
	}
	return 20 * time.Second
}

// etcdFaults injects faults into a 3-member cluster and the clients'
// proxies until ctx ends, one at a time, each mended before the next.
func etcdFaults(ctx context.Context, t *testing.T, c *embedtest.Cluster, proxies []*embedtest.Proxy, faults *faultCounts) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	kinds := []string{"stop-follower", "stop-leader", "cut-leader-peers", "blackhole-client", "pause-client"}
	for ctx.Err() == nil {
		sleep(ctx, 500*time.Millisecond+time.Duration(rng.IntN(1000))*time.Millisecond)
		if ctx.Err() != nil {
			return
		}
		leader, err := c.WaitLeader(15 * time.Second)
		if err != nil {
			t.Errorf("faults: %v", err)
			return
		}
		kind := kinds[rng.IntN(len(kinds))]
		faults.add(kind)
		switch kind {
		case "stop-follower", "stop-leader":
			m := leader
			if kind == "stop-follower" {
				m = (leader + 1 + rng.IntN(2)) % c.Size()
			}
			if err := c.Stop(m); err != nil {
				t.Errorf("stop member %d: %v", m, err)
				return
			}
			time.Sleep(time.Duration(1000+rng.IntN(2000)) * time.Millisecond)
			if err := c.Restart(m); err != nil {
				t.Errorf("restart member %d: %v", m, err)
				return
			}
		case "cut-leader-peers":
			c.CutPeer(leader)
			time.Sleep(time.Duration(1500+rng.IntN(2000)) * time.Millisecond)
			c.MendPeer(leader)
		case "blackhole-client", "pause-client":
			p := proxies[rng.IntN(len(proxies))]
			if kind == "blackhole-client" {
				p.Blackhole()
			} else {
				p.Pause()
			}
			time.Sleep(time.Duration(1000+rng.IntN(2500)) * time.Millisecond) // below and above the TTL
			p.Mend()
		}
	}
}

// TestEtcdMutexUnderFaults: 4 clients, each through its own proxy to one
// member of a 3-member cluster, take one lock and write to a fenced
// resource while members stop, the leader is cut from its peers, and
// clients' connections are blackholed or frozen. Every checker must pass.
func TestEtcdMutexUnderFaults(t *testing.T) {
	c := embedtest.EtcdCluster(t, 3)
	const clients = 4
	proxies := make([]*embedtest.Proxy, clients)
	for i := range proxies {
		u, err := url.Parse(c.Endpoint(i % c.Size()))
		if err != nil {
			t.Fatal(err)
		}
		proxies[i] = embedtest.StartProxy(t, u.Host)
	}
	name := fmt.Sprintf("safety/mutex/%d", time.Now().UnixNano())
	w := &Workload{
		Clients:  clients,
		Resource: NewResource(),
		History:  NewHistory(),
		Tracker:  &Tracker{},
		NewLocker: func(ctx context.Context, client int) (holdfast.Locker, func(), error) {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			s, err := etcd.Dial(dctx, []string{proxies[client].URL()}, etcd.WithTTL(etcd.MinTTL))
			if err != nil {
				return nil, nil, err
			}
			m, err := etcd.NewMutex(s, name)
			if err != nil {
				s.Close()
				return nil, nil, err
			}
			return holdfast.AsLocker(m), func() { s.Close() }, nil
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), duration(t))
	defer cancel()
	var faults faultCounts
	done := make(chan struct{})
	go func() { defer close(done); etcdFaults(ctx, t, c, proxies, &faults) }()
	st := w.Run(ctx)
	<-done
	for _, p := range proxies {
		p.Mend()
	}
	report(t, w, st, &faults)
	// Clean: no key left once the sessions are closed (or have expired).
	cli := c.Client(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		gctx, gcancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cli.Get(gctx, name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		gcancel()
		if err == nil && len(resp.Kvs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("keys left under %s/: %v (err %v)", name, resp, err)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// report checks the workload's records and logs the summary.
func report(t *testing.T, w *Workload, st Stats, faults *faultCounts) {
	t.Helper()
	writes := w.Resource.Writes()
	fence := CheckFence(writes)
	violations, checked := w.Tracker.Violations()
	lin := CheckLinearizable(w.History.Ops(), time.Minute)
	t.Logf("faults: %s", faults)
	t.Logf("grants=%d lock_failures=%d sessions=%d lost=%d writes=%d rejected=%d; fence violations=%d, told-first violations=%d (of %d grants), linearizable=%v",
		st.Grants, st.LockFailures, st.Sessions, st.Lost, st.Writes, st.Rejected, len(fence), len(violations), checked, lin)
	for _, v := range fence {
		t.Errorf("fence: %s", v)
	}
	for _, v := range violations {
		t.Errorf("told first: %s", v)
	}
	if lin != porcupine.Ok {
		t.Errorf("the history is not linearizable against a fenced mutex: %v", lin)
	}
	if st.Grants == 0 {
		t.Error("no grant at all: the workload did not run")
	}
}
