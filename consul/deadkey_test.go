package consul

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
)

// TestDeadRWLockKey (issue 25, item 7): an RWMutex's only holder (a reader,
// a writer) is cut off and its session ends, nobody else contends:
// NAME/.lock stays with an RWMutex's flags, naming the dead holder. While
// the holder lives, a Mutex and an Election refuse the name with
// ErrConflict saying how to free it; once it is dead, they take the name
// (the dead key replaced at its index), and nothing is left after. Before,
// both failed with ErrConflict ("flags 0x686f6c6472776c6b, not a lock's")
// on every try, for good.
func TestDeadRWLockKey(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	for _, c := range []struct{ holder, next string }{{"reader", "mutex"}, {"writer", "election"}} {
		t.Run(c.holder+"-then-"+c.next, func(t *testing.T) {
			t.Parallel()
			name := uniqueName(t)
			px, sc := proxied(t, a)
			hs := newSession(t, sc, WithLockDelay(0))
			t.Cleanup(px.Mend) // before hs closes
			rw := newRWMutex(t, hs, name)
			hold := rw.RLock
			if c.holder == "writer" {
				hold = rw.Lock
			}
			if _, err := hold(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			ns := newSession(t, a.Client(t), WithLockDelay(0))
			take := func() (*Grant, error) {
				ctx := timeout(t, 5*time.Second)
				if c.next == "election" {
					e, err := NewElection(ns, name)
					if err != nil {
						t.Fatal(err)
					}
					return e.Campaign(ctx, []byte("x"))
				}
				return newMutex(t, ns, name).Lock(ctx)
			}
			if _, err := take(); !errors.Is(err, holdfast.ErrConflict) || !strings.Contains(err.Error(), "consul kv delete") {
				t.Fatalf("%s while the RWMutex's %s lives: %v, want ErrConflict saying how to free the name", c.next, c.holder, err)
			}
			px.Pause()
			destroy(t, admin, hs.ID())
			if l := lockKeyNow(t, admin, name); l == nil || l.Flags != RWMutexFlagValue {
				t.Fatalf("NAME/.lock after the holder's session ended: %+v, want an RWMutex's", l)
			}
			g, err := take()
			if err != nil {
				t.Fatalf("%s once the RWMutex's %s is dead: %v", c.next, c.holder, err)
			}
			if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, cleanupBound, "nothing left under the name", func() bool { return len(keys(t, admin, name)) == 0 })
		})
	}
}

// deadSemaphoreKey leaves NAME/.lock as a killed `consul lock -n 2` does: a
// semaphore's lock key naming a holder whose session (Behavior release, the
// CLI's) ended, and that holder's contender key, freed.
func deadSemaphoreKey(t *testing.T, c *api.Client, name string) {
	t.Helper()
	id, _, err := c.Session().Create(&api.SessionEntry{TTL: "10s", Behavior: api.SessionBehaviorRelease, LockDelay: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: name + "/" + id, Flags: api.SemaphoreFlagValue, Session: id}, nil); err != nil || !ok {
		t.Fatal(ok, err)
	}
	v := fmt.Sprintf(`{"Limit":2,"Holders":{%q:true}}`, id)
	if _, err := c.KV().Put(&api.KVPair{Key: LockKey(name), Flags: api.SemaphoreFlagValue, Value: []byte(v)}, nil); err != nil {
		t.Fatal(err)
	}
	destroy(t, c, id)
}

// TestDeadKeyNeverAbsent (breaker finding 5): a Mutex that takes a name
// over from a dead semaphore replaces its lock key in the transaction that
// takes the lock, guarded by its index: at no moment is the name without a
// lock key, so a `consul lock -n` that joins reads either the dead key
// (and takes it over: the Mutex's take then fails its check and the Mutex
// refuses the name) or the Mutex's. (What is left: one that joins between
// the Mutex's read of the name and its take, a few milliseconds, reads the
// Mutex's key and fails; Consul's transactions cannot check that no key
// appeared under a prefix.) The lock key is read before each of the
// Mutex's requests. Before, the Mutex deleted the dead key, then read the
// lock key and queued up before it took the lock: a `consul lock -n 2`
// that read the name in between created its own lock key and then failed
// with "Existing key does not match semaphore use" once the Mutex's take
// landed (6 of 12 rounds, TestBreakDeadSemaphoreJoining).
func TestDeadKeyNeverAbsent(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	var watch, absent atomic.Bool
	ft := &embedtest.FaultTransport{Observe: func(_, _ string, _ []byte) {
		if watch.Load() {
			if l, _, err := admin.KV().Get(LockKey(name), nil); err == nil && l == nil {
				absent.Store(true)
			}
		}
	}}
	t.Cleanup(ft.Close)
	c, err := a.NewClient(func(cfg *api.Config) { cfg.HttpClient = &http.Client{Transport: ft} })
	if err != nil {
		t.Fatal(err)
	}
	m := newMutex(t, newSession(t, c, WithLockDelay(0)), name)
	for _, try := range []bool{false, true} {
		deadSemaphoreKey(t, admin, name)
		watch.Store(true)
		var g *Grant
		if try {
			g, err = m.TryLock(timeout(t, 5*time.Second))
		} else {
			g, err = m.Lock(timeout(t, 5*time.Second))
		}
		watch.Store(false)
		if err != nil {
			t.Fatalf("try=%v on a dead semaphore's name: %v", try, err)
		}
		if absent.Load() {
			t.Errorf("try=%v: the name had no lock key between the dead semaphore's and the Mutex's", try)
		}
		if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, cleanupBound, "only the dead contender's freed key left", func() bool { return len(keys(t, admin, name)) == 1 })
		if _, err := admin.KV().DeleteTree(name+"/", nil); err != nil {
			t.Fatal(err)
		}
	}
}
