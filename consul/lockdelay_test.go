package consul

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// TestWokenWaiterHolderDelay (breaker finding 1): L holds with a 1 s
// lock-delay (a native api.Lock, or a holdfast Mutex cut off from Consul),
// P waits at the head with the default 15 s lock-delay, W is linked behind
// P. L's session ends (its 1 s lock-delay starts); 0.3 s later P's Lock is
// cancelled, which wakes W. W must be granted within L's lock-delay + 1 s
// of L's end: P never held the lock, so its delay does not apply. Before
// the fix, W waited out P's 15 s (granted 15.3 s after L's end).
func TestWokenWaiterHolderDelay(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	const delay = time.Second
	for _, holder := range []string{"native", "holdfast"} {
		t.Run(holder, func(t *testing.T) {
			t.Parallel()
			name := uniqueName(t)
			var id string
			if holder == "native" {
				l, err := admin.LockOpts(&api.LockOptions{Key: LockKey(name), SessionOpts: &api.SessionEntry{TTL: "10s", LockDelay: delay}})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := l.Lock(nil); err != nil {
					t.Fatal(err)
				}
				id = lockKeyNow(t, admin, name).Session
			} else {
				px, sc := proxied(t, a)
				hs := newSession(t, sc, WithLockDelay(delay))
				t.Cleanup(px.Mend) // before hs closes
				if _, err := newMutex(t, hs, name).Lock(timeout(t, 5*time.Second)); err != nil {
					t.Fatal(err)
				}
				id = hs.ID()
				px.Pause() // not renewed any more: its session is destroyed below
			}
			p := newMutex(t, newSession(t, a.Client(t)), name) // the default lock-delay, 15 s
			pctx, pcancel := context.WithCancel(context.Background())
			defer pcancel()
			queueUp(t, admin, p, pctx)
			wc, cnt := countingClient(t, a)
			w := newMutex(t, newSession(t, wc, WithLockDelay(0)), name)
			res := queueUp(t, admin, w, timeout(t, 20*time.Second))
			linked(t, admin, p, w)
			time.Sleep(100 * time.Millisecond) // P at the head, watching the lock key
			destroy(t, admin, id)
			ended, n0 := time.Now(), cnt.n.Load()
			time.Sleep(300 * time.Millisecond)
			pcancel()
			r := receive(t, res, delay+5*time.Second, "W")
			took, requests := time.Since(ended), cnt.n.Load()-n0
			if r.err != nil {
				t.Fatalf("W: %v", r.err)
			}
			t.Logf("W granted %v after L's session ended, %d requests (L's lock-delay %v, P's 15 s)", took.Round(time.Millisecond), requests, delay)
			if took > delay+time.Second {
				t.Errorf("W granted %v after L's session ended, want within L's lock-delay %v + 1 s", took, delay)
			}
			// W does not know when L's delay ends: it backs off to a retry
			// every 500 ms (before, every 25 ms).
			if requests > 15 {
				t.Errorf("W made %d requests from L's end to its grant, want <= 15", requests)
			}
			if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPlainTailLeftover (breaker finding 4): H holds and is cut off, its
// session ends. C locks within H's lock-delay (a restart of the same
// service), so its queue-up writes the tail key plain (the delay refuses
// its acquire); C is granted once the delay ends, then is cut off and its
// session ends too. Nobody else contends: nothing may be left under the
// name. Before, NAME/.tail stayed (no session, naming C) for good.
func TestPlainTailLeftover(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	for range 2 {
		px, sc := proxied(t, a)
		s := newSession(t, sc, WithLockDelay(500*time.Millisecond))
		t.Cleanup(px.Mend) // before s closes
		if _, err := newMutex(t, s, name).Lock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		px.Pause()
		destroy(t, admin, s.ID())
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, time.Second, "nothing left under the name once both sessions ended", func() bool { return len(keys(t, admin, name)) == 0 })
}
