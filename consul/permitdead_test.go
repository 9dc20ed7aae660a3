package consul

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// permitLocker is a Semaphore's or an RWMutex's Lock (RLock: shared).
type permitLocker func(ctx context.Context) (*Grant, error)

// cutOff starts a permit holder on a session reached through a proxy; kill
// cuts it off and ends its session (a SIGKILLed holder whose session
// Consul has just invalidated). Lock-delay 0: a permit has no lock-delay to
// wait out anyway.
func cutOff(t *testing.T, lock func(*Session) permitLocker) (kill func()) {
	t.Helper()
	a := agent(t)
	px, c := proxied(t, a)
	s := newSession(t, c, WithLockDelay(0))
	t.Cleanup(px.Mend) // before the session's Close
	if _, err := lock(s)(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	return func() { px.Pause(); destroy(t, a.Client(t), s.ID()) }
}

// lockLater starts lock on a fresh session; the channel gets its grant (nil
// if it failed), released when the test ends.
func lockLater(t *testing.T, lock permitLocker) <-chan *Grant {
	ch := make(chan *Grant, 1)
	go func() {
		g, err := lock(timeout(t, 20*time.Second))
		if err != nil {
			ch <- nil
			return
		}
		t.Cleanup(func() { _ = g.Unlock(timeout(t, 2*time.Second)) })
		ch <- g
	}()
	return ch
}

// TestPermitWaiterWokenByDeadHolder: a waiter of a Semaphore or an RWMutex
// is admitted within 1 s (lock-delay 0 + 1 s, issue 25's bound) of its
// holder's session ending, as api.Semaphore's waiter is (it watches the
// name's tree), also when the waiter got to the head of the queue
// unnoticed (the waiter ahead of it admitted, then dead). Before: it
// waited for the 5 s re-read (admitted 2.7-4.9 s after).
func TestPermitWaiterWokenByDeadHolder(t *testing.T) {
	a := agent(t)
	var name string // each subtest's
	sem := func(s *Session) permitLocker {
		m, err := NewSemaphore(s, name, 1)
		if err != nil {
			t.Fatal(err)
		}
		return m.Lock
	}
	writer := func(s *Session) permitLocker { m, _ := NewRWMutex(s, name); return m.Lock }
	reader := func(s *Session) permitLocker { m, _ := NewRWMutex(s, name); return m.RLock }
	fresh := func() *Session { return newSession(t, a.Client(t), WithLockDelay(0)) }
	admitted := func(t *testing.T, ch <-chan *Grant, ended time.Time, what string) {
		t.Helper()
		granted(t, ch, time.Second, what)
		t.Logf("%s admitted %v after the holder's session ended", what, time.Since(ended).Round(time.Millisecond))
	}
	for _, c := range []struct {
		name           string
		holder, waiter func(*Session) permitLocker
	}{{"semaphore", sem, sem}, {"rw", writer, reader}} {
		t.Run(c.name, func(t *testing.T) {
			name = uniqueName(t)
			kill := cutOff(t, c.holder)
			w := lockLater(t, c.waiter(fresh()))
			time.Sleep(300 * time.Millisecond)
			kill()
			admitted(t, w, time.Now(), "the waiter")
		})
	}
	t.Run("chain", func(t *testing.T) {
		name = uniqueName(t)
		kill := cutOff(t, sem)
		px, pc := proxied(t, a)
		s1 := newSession(t, pc, WithLockDelay(0))
		t.Cleanup(px.Mend)
		w1 := lockLater(t, sem(s1))
		time.Sleep(200 * time.Millisecond)
		w2 := lockLater(t, sem(fresh()))
		time.Sleep(300 * time.Millisecond)
		kill()
		admitted(t, w1, time.Now(), "the first waiter")
		time.Sleep(300 * time.Millisecond)
		px.Pause()
		destroy(t, a.Client(t), s1.ID())
		admitted(t, w2, time.Now(), "the second waiter")
	})
}

// TestPermitDeadOtherKind (issue 25, item 7; the Semaphore and RWMutex side
// of deadkey.go's rule): a Semaphore's or an RWMutex's only holder is cut
// off and its session ends, nobody else contends: NAME/.lock stays with its
// kind's flags. While the holder lives, the other kind refuses the name with
// ErrConflict saying how to free it; once it is dead, the other kind takes
// the name (the dead key replaced at its index; Lock and TryLock), and
// nothing is left after. Before, a dead RWMutex's key refused a Semaphore,
// and a dead Semaphore's an RWMutex, for good ("flags ..., not a
// semaphore's"), without saying how to free the name.
func TestPermitDeadOtherKind(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	for _, c := range []struct {
		dead string
		try  bool
	}{{"rw", false}, {"semaphore", false}, {"rw", true}} {
		next := map[string]string{"rw": "semaphore", "semaphore": "rw"}[c.dead]
		t.Run(c.dead+"-then-"+next+map[bool]string{true: "-try"}[c.try], func(t *testing.T) {
			t.Parallel()
			name := uniqueName(t)
			lock := func(s *Session, kind string, try bool) permitLocker {
				if kind == "semaphore" {
					m := newSemaphore(t, s, name, 1)
					return map[bool]permitLocker{false: m.Lock, true: m.TryLock}[try]
				}
				m := newRWMutex(t, s, name)
				return map[bool]permitLocker{false: m.RLock, true: m.TryLock}[try]
			}
			kill := cutOff(t, func(s *Session) permitLocker { return lock(s, c.dead, false) })
			ns := newSession(t, a.Client(t), WithLockDelay(0))
			if _, err := lock(ns, next, c.try)(timeout(t, 5*time.Second)); !errors.Is(err, holdfast.ErrConflict) || !strings.Contains(err.Error(), "consul kv delete") {
				t.Fatalf("%s while the %s's holder lives: %v, want ErrConflict saying how to free the name", next, c.dead, err)
			}
			kill()
			if l := lockKeyNow(t, admin, name); l == nil {
				t.Fatal("NAME/.lock gone with the holder's session: nothing to test")
			}
			g, err := lock(ns, next, c.try)(timeout(t, 5*time.Second))
			if err != nil {
				t.Fatalf("%s once the %s's holder is dead: %v", next, c.dead, err)
			}
			if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, cleanupBound, "nothing left under the name", func() bool { return len(keys(t, admin, name)) == 0 })
		})
	}
}

// TestWatchKeyBound: a bounded watch of a key that does not change returns
// nil once its bound has passed (the head's handoffPatience relies on it).
// Before, it returned the unchanged key, which the head took for a change:
// it read again and waited its patience twice (the chain's second waiter of
// TestPermitWaiterWokenByDeadHolder admitted 213-217 ms after its holder's
// session ended, 1 ms now).
func TestWatchKeyBound(t *testing.T) {
	a := agent(t)
	s := newSession(t, a.Client(t))
	key := uniqueName(t)
	if _, err := a.Client(t).KV().Put(&api.KVPair{Key: key, Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = a.Client(t).KV().Delete(key, nil) })
	pair, _, err := a.Client(t).KV().Get(key, nil)
	if err != nil || pair == nil {
		t.Fatalf("get %s: %v", key, err)
	}
	got, err := s.watchKey(timeout(t, 5*time.Second), key, pair.ModifyIndex, 100*time.Millisecond)
	if err != nil || got != nil {
		t.Fatalf("watchKey of an unchanged key past its bound: %+v, %v; want nil, nil", got, err)
	}
}
