package consul

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-cleanhttp"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/conformance"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/leader"
)

// conformanceTTL is the session TTL of the conformance harness.
const conformanceTTL = 10 * time.Second

// countingTransport counts the requests that are not blocking queries.
type countingTransport struct {
	n    atomic.Int64
	next http.RoundTripper
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.Contains(r.URL.RawQuery, "index=") {
		c.n.Add(1)
	}
	return c.next.RoundTrip(r)
}

// TestConformance runs the shared suite: each Locker has a session of its
// own (TTL 10 s, lock-delay 0) on a client of its own, connected through a
// fault proxy; Kill destroys the session through another client, as Consul
// does when it invalidates one.
func TestConformance(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	// session returns a session of its own (TTL 10 s, lock-delay 0) on a
	// client of its own, connected through a fault proxy, and its faults.
	session := func(t *testing.T) (*Session, conformance.Faults) {
		p := embedtest.StartProxy(t, a.HTTPAddr)
		base := cleanhttp.DefaultPooledTransport()
		t.Cleanup(base.CloseIdleConnections)
		tr := &countingTransport{next: base}
		cli, err := a.NewClient(func(cfg *api.Config) {
			cfg.Address = p.Addr()
			cfg.HttpClient = &http.Client{Transport: tr}
		})
		if err != nil {
			t.Fatal(err)
		}
		s := newSession(t, cli, WithTTL(conformanceTTL), WithLockDelay(0))
		return s, conformance.Faults{
			Kill:     func() { destroy(t, admin, s.ID()) },
			Cut:      p.Blackhole,
			Freeze:   p.Pause,
			Mend:     p.Mend,
			Close:    func() { s.Close() },
			Requests: tr.n.Load,
		}
	}
	conformance.Run(t, conformance.Backend{
		NewLocker: func(t *testing.T, name string, opts ...holdfast.LockOption) (holdfast.Locker, conformance.Faults) {
			s, f := session(t)
			m, err := NewMutex(s, name, opts...)
			if err != nil {
				t.Fatalf("NewMutex(%q): %v", name, err)
			}
			return holdfast.AsLocker[*Grant](m), f
		},
		NewSemaphore: func(t *testing.T, name string, limit int, opts ...holdfast.LockOption) (holdfast.Locker, conformance.Faults) {
			s, f := session(t)
			sem, err := NewSemaphore(s, name, limit, opts...)
			if err != nil {
				t.Fatalf("NewSemaphore(%q, %d): %v", name, limit, err)
			}
			return holdfast.AsLocker[*Grant](sem), f
		},
		NewRWMutex: func(t *testing.T, name string) (conformance.RWLocker, conformance.Faults) {
			s, f := session(t)
			rw, err := NewRWMutex(s, name)
			if err != nil {
				t.Fatalf("NewRWMutex(%q): %v", name, err)
			}
			return conformance.AsRWLocker[*Grant](rw), f
		},
		TryNewRWMutex: func(t *testing.T, name string, opts ...holdfast.LockOption) (conformance.RWLocker, error) {
			s, _ := session(t)
			rw, err := NewRWMutex(s, name, opts...)
			if err != nil {
				return nil, err
			}
			return conformance.AsRWLocker[*Grant](rw), nil
		},
		NewElection: func(t *testing.T, name string) (leader.Candidate[holdfast.Grant], conformance.Faults) {
			s, f := session(t)
			e, err := NewElection(s, name)
			if err != nil {
				t.Fatalf("NewElection(%q): %v", name, err)
			}
			return conformance.AsCandidate[*Grant](e), f
		},
		NewClaimer: func(t *testing.T, name string, sched holdfast.Schedule) (conformance.Claimer, conformance.Faults) {
			s, f := session(t)
			o, err := NewOnce(s, name, sched)
			if err != nil {
				t.Fatalf("NewOnce(%q): %v", name, err)
			}
			return conformance.AsClaimer[*Claim](o), f
		},
		NewMultiLocker: func(t *testing.T) (func(names ...string) (conformance.MultiLocker, error), conformance.Faults) {
			s, f := session(t)
			return func(names ...string) (conformance.MultiLocker, error) {
				m, err := NewMultiMutex(s, names...)
				if err != nil {
					return nil, err
				}
				return conformance.AsMultiLocker[*MultiGrant](m), nil
			}, f
		},
		// AtMost is Consul's floor (2 x MinTTL); Consul invalidates the
		// claim session by 2 x TTL = AtMost, give or take its timer.
		ClaimSchedule: holdfast.Schedule{Every: 5 * time.Second, AtLeast: 2 * time.Second, AtMost: 2 * MinTTL},
		ClaimFree:     3 * time.Second,
		// Observe follows the lock key with blocking queries, which may
		// skip to its latest state.
		ObserveAll: false,
		// One key per contender, as on etcd (see contenderKeys).
		Keys: func(t *testing.T, name string) []string { return contenderKeys(t, admin, name) },
		Delete: func(t *testing.T, key string) {
			if _, err := admin.KV().Delete(key, nil); err != nil {
				t.Fatalf("delete %s: %v", key, err)
			}
		},
		TTL:    conformanceTTL,
		Margin: conformanceTTL / 5,
		// A destroyed session is seen through the session watch at once; a
		// deleted key at the check of held keys after the next renewal:
		// TTL/3, plus slack.
		LossNotice: conformanceTTL/3 + time.Second,
		// A session cut off is invalidated by Consul up to 2 x TTL after its
		// last renewal.
		OpTimeout: 2*conformanceTTL + 15*time.Second,
	})
}
