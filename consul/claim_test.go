package consul

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

// TestClaimGuardedTxn: a claim's key is the run's mark "<name>/.run", held
// by the claim's own session, and its token the ModifyIndex of the record
// "<name>/.claim" (held by no session, the period as its value); Claim.Txn
// applies while the claim is held, refuses ops on the claim's key, and once
// the key was deleted from outside (which the claim does not watch) or the
// claim released, applies nothing and returns ErrNotHeld. A claim of a
// period that is over is refused with ErrPeriodOver, one of the same period
// after the run with ErrClaimed (the record); nothing but the record is
// left, and no claim session.
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
	if g, err := o.ClaimPeriod(ctx, o.sched.Period(time.Now()).Add(-time.Hour)); !errors.Is(err, holdfast.ErrPeriodOver) || !errors.Is(err, holdfast.ErrClaimed) {
		t.Fatalf("a claim of the last period, over: %v %v, want ErrPeriodOver (and ErrClaimed)", g, err)
	}
	cl, err := o.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pair, _, err := admin.KV().Get(name+"/.run", nil)
	if err != nil || pair == nil {
		t.Fatalf("run key: %v %v", pair, err)
	}
	rec, _, err := admin.KV().Get(name+"/.claim", nil)
	if err != nil || rec == nil {
		t.Fatalf("record: %v %v", rec, err)
	}
	if cl.Key() != name+"/.run" || uint64(cl.Token()) != rec.ModifyIndex || pair.Session != cl.id || pair.Flags != ClaimFlags || rec.Flags != ClaimFlags || rec.Session != "" {
		t.Errorf("key %q token %d session %s: want the run key, the record's ModifyIndex %d, held by %s with ClaimFlags (got %x, record %x held by %q)", cl.Key(), cl.Token(), cl.id, rec.ModifyIndex, pair.Session, pair.Flags, rec.Flags, rec.Session)
	}
	if p, _ := time.Parse(time.RFC3339Nano, string(rec.Value)); !p.Equal(cl.Period()) {
		t.Errorf("record %q, want the period %v", rec.Value, cl.Period())
	}
	if _, err := cl.Txn(ctx, api.TxnOps{setOp(record, "v1")}); err != nil {
		t.Fatalf("Txn while held: %v", err)
	}
	for _, k := range []string{name + "/.claim", name + "/.run"} {
		if _, err := cl.Txn(ctx, api.TxnOps{setOp(k, "x")}); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("Txn on %s: %v, want ErrInvalidArgument", k, err)
		}
	}
	if _, err := admin.KV().Delete(name+"/.run", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Txn(ctx, api.TxnOps{setOp(record, "stale")}); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Txn after the claim key was deleted: %v, want ErrNotHeld", err)
	}
	if v := value(t, admin, record); v != "v1" {
		t.Errorf("record %q after a refused write, want v1", v)
	}
	_ = cl.Unlock(ctx)

	if g, err := o.ClaimPeriod(ctx, cl.Period()); !errors.Is(err, holdfast.ErrClaimed) {
		t.Fatalf("a claim of the same period after its run: %v %v, want ErrClaimed (the record)", g, err)
	}
	cl2, err := o.ClaimPeriod(ctx, cl.Period().Add(time.Hour))
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
	waitFor(t, 5*time.Second, "the record alone left", func() bool { ks := keys(t, admin, name); return len(ks) == 1 && ks[0] == name+"/.claim" })
	if ids := claimSessions(t, admin, name); len(ids) != 0 {
		t.Errorf("claim sessions left after Unlock and a refused claim: %v", ids)
	}
	for _, sched := range []holdfast.Schedule{{Every: time.Minute, AtMost: 19 * time.Second}, {Every: time.Minute, AtLeast: time.Minute, AtMost: 30 * time.Second}} {
		if _, err := NewOnce(s, name, sched); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("NewOnce(%+v): %v, want ErrInvalidArgument", sched, err)
		}
	}
}

// TestClaimOldFormat: a claim key of an older holdfast ("<name>/.claim"
// held by a session, with a JSON value) refuses claims, saying so, until
// its session ends; then a claim succeeds and writes the record in its
// place.
func TestClaimOldFormat(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	id, _, err := admin.Session().Create(&api.SessionEntry{Behavior: api.SessionBehaviorDelete, TTL: "60s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := admin.KV().Acquire(&api.KVPair{Key: name + "/.claim", Flags: ClaimFlags, Session: id, Value: []byte(`{"period":"2026-11-25T10:00:00Z"}`)}, nil); err != nil || !ok {
		t.Fatalf("old claim key: %v %v", ok, err)
	}
	s := newSession(t, a.Client(t))
	ctx := timeout(t, 20*time.Second)
	o, err := NewOnce(s, name, holdfast.Schedule{Every: time.Hour, AtMost: 2 * MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	if g, err := o.Claim(ctx); !errors.Is(err, holdfast.ErrClaimed) || !strings.Contains(err.Error(), "older holdfast") {
		t.Fatalf("claim over an old claim key: %v %v, want ErrClaimed saying it is an older holdfast's", g, err)
	}
	if _, err := admin.Session().Destroy(id, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the old claim key deleted with its session", func() bool { return len(keys(t, admin, name)) == 0 })
	g, err := o.Claim(ctx)
	if err != nil {
		t.Fatalf("claim once the old key is gone: %v", err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if rec, _, err := admin.KV().Get(name+"/.claim", nil); err != nil || rec == nil || rec.Session != "" || rec.Flags != ClaimFlags {
		t.Errorf("record %+v %v, want the new record, held by no session", rec, err)
	}
}
