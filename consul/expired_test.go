package consul

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// expiredBound is how long the keys of a session that Consul invalidated
// may stay under the name when nobody else contends: Consul deletes them
// as it invalidates the session (Behavior delete), so well under the
// session's expiry (up to 2 x TTL) + its lock-delay + 1 s.
const expiredBound = 2 * time.Second

// TestExpiredSessionLeavesNothing (issue 25, defect 6b; CI's keys_left in
// TestConsulElectionUnderFaults): S holds, campaigns or waits through a
// fault proxy; S is cut off (the proxy freezes, as a paused process or a
// frozen agent would) and its session ends: destroyed here, which is what
// Consul does when the TTL expires (the session timer invalidates it by a
// destroy) without waiting 2 x TTL. Nobody else contends: nothing of S may
// stay under the name. Before, with Behavior release, S's entry, held
// mark, tail key (and a freed lock key) stayed until the next contender
// came, for good if none did.
func TestExpiredSessionLeavesNothing(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, name string, s *Mutex, cut func())
	}{
		{"holder", func(t *testing.T, name string, s *Mutex, cut func()) {
			if _, err := s.Lock(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			cut()
			waitFor(t, expiredBound, "nothing left under the name", func() bool { return len(keys(t, admin, name)) == 0 })
		}},
		{"leader", func(t *testing.T, name string, s *Mutex, cut func()) {
			if _, err := (&Election{m: s}).Campaign(timeout(t, 5*time.Second), []byte("s")); err != nil {
				t.Fatal(err)
			}
			cut()
			waitFor(t, expiredBound, "nothing left under the name", func() bool { return len(keys(t, admin, name)) == 0 })
		}},
		{"holder-api.Lock-waits", func(t *testing.T, name string, s *Mutex, cut func()) {
			// A native api.Lock waiting on the lock key sees it deleted
			// with S's session, and takes it once S's lock-delay is over
			// (its 5 s retry after a refusal: S's lock-delay is 0 here).
			if _, err := s.Lock(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			l, err := admin.LockOpts(&api.LockOptions{Key: LockKey(name), SessionTTL: "10s"})
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				_, err := l.Lock(stop)
				got <- err
			}()
			time.Sleep(100 * time.Millisecond) // api.Lock blocks on the key
			cut()
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(3 * time.Second):
				t.Fatalf("api.Lock not granted 3 s after S's session ended: keys %q", keys(t, admin, name))
			}
			waitFor(t, expiredBound, "only api.Lock's lock key left", func() bool {
				return slices.Equal(keys(t, admin, name), []string{LockKey(name)})
			})
			if err := l.Unlock(); err != nil {
				t.Fatal(err)
			}
			if err := l.Destroy(); err != nil {
				t.Fatal(err)
			}
		}},
		{"waiter-behind-api.Lock", func(t *testing.T, name string, s *Mutex, cut func()) {
			release := foreignHolder(t, admin, name)
			queueUp(t, admin, s, timeout(t, 30*time.Second))
			cut()
			waitFor(t, expiredBound, "only the native holder's lock key left", func() bool {
				return slices.Equal(keys(t, admin, name), []string{LockKey(name)})
			})
			release()
		}},
		{"waiter-behind-holdfast", func(t *testing.T, name string, s *Mutex, cut func()) {
			h := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)
			hg, err := h.Lock(timeout(t, 5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			queueUp(t, admin, s, timeout(t, 30*time.Second))
			linked(t, admin, h, s)
			cut()
			waitFor(t, expiredBound, "S's entry, link and the tail naming it gone", func() bool {
				for _, k := range keys(t, admin, name) {
					if strings.HasPrefix(k, s.queueKey()) && !strings.HasPrefix(k, s.queueKey()+prevInfix) || k == s.tailKey() || strings.HasSuffix(k, nextInfix+s.s.ID()) {
						return false
					}
				}
				return true
			})
			if err := hg.Unlock(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, expiredBound, "nothing left under the name", func() bool { return len(keys(t, admin, name)) == 0 })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := uniqueName(t)
			px, sc := proxied(t, a)
			delay := time.Second // the safety scenario's
			if strings.Contains(tc.name, "api.Lock-waits") {
				delay = 0
			}
			ss := newSession(t, sc, WithLockDelay(delay))
			t.Cleanup(px.Mend) // before ss.Close
			s := newMutex(t, ss, name)
			tc.run(t, name, s, func() {
				px.Pause()
				destroy(t, admin, ss.ID())
			})
		})
	}
}

// TestRepairTailDropsDead: a dead queue entry D (its session, with
// Behavior release, was invalidated: the entry stays, freed) that the tail
// key does not name; R waits at the head behind a native api.Lock holder
// and gives up: its leave repairs the tail key, which names R, by deleting
// it (no live entry is left). The repair deletes D too: once the tail key
// is gone, the next contender takes the lock without reading the queue.
// Before, D stayed for good (seen as keys_left=[<name>/.queue/<D>
// <name>/.queue/<D>/held] by TestConsulElectionUnderFaults, whose last
// contender took the lock alone and never met D).
func TestRepairTailDropsDead(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	dead, _, err := admin.Session().Create(&api.SessionEntry{TTL: "10s", Behavior: api.SessionBehaviorRelease, LockDelay: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := name + queueInfix + dead
	for _, k := range []string{d, d + heldSuffix} {
		if ok, _, err := admin.KV().Acquire(&api.KVPair{Key: k, Session: dead}, nil); err != nil || !ok {
			t.Fatalf("acquire %s: %v %v", k, ok, err)
		}
	}
	destroy(t, admin, dead)
	release := foreignHolder(t, admin, name)
	defer release()
	r := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := queueUp(t, admin, r, ctx)
	cancel()
	if got := <-res; got.err == nil {
		t.Fatal("R's Lock succeeded behind a native holder")
	}
	waitFor(t, cleanupBound, "R's entry, the tail key and D gone", func() bool {
		return slices.Equal(keys(t, admin, name), []string{LockKey(name)})
	})
}

// TestTailLockDelayed: S held the tail key (it queued last) when its
// session ended, so Consul applies S's lock-delay (1 s) to the tail key as
// it deletes it; X comes within that delay. X still queues up or takes the
// lock (the tail key is then written plain), and once X unlocks nothing is
// left. Without the plain write, X's queue-up was refused (Lock failed, its
// session taken for ended) and a free lock looked lock-delayed to TryLock.
func TestTailLockDelayed(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	for _, try := range []bool{false, true} {
		t.Run(map[bool]string{false: "lock", true: "trylock"}[try], func(t *testing.T) {
			t.Parallel()
			name := uniqueName(t)
			px, sc := proxied(t, a)
			ss := newSession(t, sc, WithLockDelay(time.Second))
			t.Cleanup(px.Mend) // before ss.Close
			s := newMutex(t, ss, name)
			var release func()
			if try {
				// S waits behind a native holder: only the tail key is S's.
				release = foreignHolder(t, admin, name)
				queueUp(t, admin, s, timeout(t, 30*time.Second))
			} else if _, err := s.Lock(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			px.Pause()
			destroy(t, admin, ss.ID())
			if release != nil {
				release()
				if _, err := admin.KV().Delete(LockKey(name), nil); err != nil {
					t.Fatal(err)
				}
			}
			x := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)
			var g *Grant
			var err error
			if try {
				g, err = x.TryLock(timeout(t, 5*time.Second))
			} else {
				g, err = x.Lock(timeout(t, 5*time.Second))
			}
			if err != nil {
				t.Fatalf("X within S's lock-delay on the tail key: %v", err)
			}
			if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, expiredBound, "nothing left under the name", func() bool { return len(keys(t, admin, name)) == 0 })
		})
	}
}
