package consul

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
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
