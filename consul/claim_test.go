package consul

import (
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// TestClaimGuardedTxn: a claim's key is "<name>/.claim", held by the
// claim's own session, and its token the key's ModifyIndex; Claim.Txn
// applies while the claim is held, refuses ops on the claim's key, and once
// the key was deleted from outside (which the claim does not watch) or the
// claim released, applies nothing and returns ErrNotHeld.
func TestClaimGuardedTxn(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	record := name + "-record"
	t.Cleanup(func() { _, _ = admin.KV().Delete(record, nil) })
	s := newSession(t, a.Client(t))
	ctx := timeout(t, 20*time.Second)
	o, err := NewOnce(s, name, holdfast.Schedule{Every: time.Hour, AtMost: 2 * MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := o.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pair, _, err := admin.KV().Get(name+"/.claim", nil)
	if err != nil || pair == nil {
		t.Fatalf("claim key: %v %v", pair, err)
	}
	if cl.Key() != name+"/.claim" || uint64(cl.Token()) != pair.ModifyIndex || pair.Session != cl.Session() || pair.Flags != ClaimFlags {
		t.Errorf("key %q token %d session %s: want the claim key, its ModifyIndex %d, held by %s with ClaimFlags (got %x)", cl.Key(), cl.Token(), cl.Session(), pair.ModifyIndex, pair.Session, pair.Flags)
	}
	if _, err := cl.Txn(ctx, api.TxnOps{setOp(record, "v1")}); err != nil {
		t.Fatalf("Txn while held: %v", err)
	}
	if _, err := cl.Txn(ctx, api.TxnOps{setOp(name+"/.claim", "x")}); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Txn on the claim key: %v, want ErrInvalidArgument", err)
	}
	if _, err := admin.KV().Delete(name+"/.claim", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Txn(ctx, api.TxnOps{setOp(record, "stale")}); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Txn after the claim key was deleted: %v, want ErrNotHeld", err)
	}
	if v := value(t, admin, record); v != "v1" {
		t.Errorf("record %q after a refused write, want v1", v)
	}
	_ = cl.Unlock(ctx)

	cl2, err := o.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cl2.Token() <= cl.Token() {
		t.Errorf("second token %d, want above %d", cl2.Token(), cl.Token())
	}
	if err := cl2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cl2.Txn(ctx, api.TxnOps{setOp(record, "late")}); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Txn after Unlock: %v, want ErrNotHeld", err)
	}
	waitFor(t, 5*time.Second, "claim key removed", func() bool { return len(keys(t, admin, name)) == 0 })
	for _, sched := range []holdfast.Schedule{{Every: time.Minute, AtMost: 19 * time.Second}, {Every: time.Minute, AtLeast: time.Minute, AtMost: 30 * time.Second}} {
		if _, err := NewOnce(s, name, sched); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("NewOnce(%+v): %v, want ErrInvalidArgument", sched, err)
		}
	}
}
