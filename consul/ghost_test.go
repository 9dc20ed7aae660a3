package consul

import (
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// TestLateHandoffRelocked (issue 25, defect 2, as tests/shard met it): S's
// queue-up lands after its Lock gave up, the lock is handed to that entry
// as H's Unlock would (the lock key is held by S's session, with no grant
// behind it), and S locks the name again before the session's delayed
// sweep of the failed attempt ran, W queueing beside it. The new
// acquisition releases the stale lock key, and wakes W if W linked behind
// the stale entry: both are granted, one after the other. Before the fix
// S's new entry waited for a handoff that could not come (the key was its
// own session's), W behind it: S's Lock ended with its 3 s context, the
// lock key held by S.
func TestLateHandoffRelocked(t *testing.T) {
	t.Parallel()
	l := lateQueueUp(t, 300*time.Millisecond, 50*time.Millisecond)
	admin, name, s, w, hg := l.admin, l.name, l.s, l.w, l.hg
	if err := hg.Unlock(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// What H's handoff to S's entry writes (H hands only to a linked
	// waiter, and S's entry never linked: the test writes it for H).
	ok, _, _, err := admin.Txn().Txn(api.TxnOps{
		lockOp(s.lockKey(), s.s.id, []byte(valueTaken)),
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: s.queueKey() + heldSuffix, Session: s.s.id}},
	}, nil)
	if err != nil || !ok {
		t.Fatalf("hand the lock to S's stale entry: %v %v", ok, err)
	}
	sres := lockAsync(s, timeout(t, 3*time.Second))
	wres := lockAsync(w, timeout(t, 10*time.Second))
	for range 2 { // W may queue first, behind S's stale entry
		var r lockResult
		who := "S"
		select {
		case r = <-sres:
		case r = <-wres:
			who = "W"
		case <-time.After(5 * time.Second):
			t.Fatalf("neither S nor W granted within 5 s (lock key %+v, keys %v)", lockKeyNow(t, admin, name), keys(t, admin, name))
		}
		if r.err != nil {
			t.Fatalf("%s: %v (lock key %+v, keys %v)", who, r.err, lockKeyNow(t, admin, name), keys(t, admin, name))
		}
		if err := r.g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 2*time.Second, "nothing left under the name", func() bool { return len(keys(t, admin, name)) == 0 })
}
