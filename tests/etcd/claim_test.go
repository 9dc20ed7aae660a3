package etcd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// TestClaimGuardedTxn: a claim's key and token are the run's mark
// "<name>/.run" and its create revision, which is the mod revision of the
// record "<name>/.claim" (no lease, the period as its value); Claim.Txn
// commits while the claim is held, refuses ops on the claim's keys, and
// once the mark was deleted from outside (which the claim does not watch)
// or the claim released, applies nothing and returns ErrNotHeld. A claim
// of a period that is over is refused with ErrPeriodOver; one of the same
// period after the run is refused (the record); after Unlock
// and a refused claim, the record is the one key left, and no lease.
func TestClaimGuardedTxn(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	s := newSession(t, c)
	sched := holdfast.Schedule{Every: time.Hour, AtLeast: 0, AtMost: 10 * time.Second}
	o, err := etcd.NewOnce(s, "jobs/claimed", sched)
	if err != nil {
		t.Fatal(err)
	}
	if g, err := o.ClaimPeriod(ctx, sched.Period(time.Now()).Add(-sched.Every)); !errors.Is(err, holdfast.ErrPeriodOver) || !errors.Is(err, holdfast.ErrClaimed) {
		t.Fatalf("a claim of the last period, over: %v %v, want ErrPeriodOver (and ErrClaimed)", g, err)
	}
	cl, err := o.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "jobs/claimed/.run")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("run key: %v %v", resp, err)
	}
	rec, err := cli.Get(ctx, "jobs/claimed/.claim")
	if err != nil || len(rec.Kvs) != 1 {
		t.Fatalf("record: %v %v", rec, err)
	}
	if cl.Key() != "jobs/claimed/.run" || int64(cl.Token()) != resp.Kvs[0].CreateRevision || !cl.Period().Equal(sched.Period(time.Now())) {
		t.Errorf("key %q token %d period %v: want the run key, its create revision %d, this period", cl.Key(), cl.Token(), cl.Period(), resp.Kvs[0].CreateRevision)
	}
	if kv := rec.Kvs[0]; kv.ModRevision != int64(cl.Token()) || kv.Lease != 0 {
		t.Errorf("record %q: mod revision %d lease %x, want the token %d and no lease", kv.Value, kv.ModRevision, kv.Lease, cl.Token())
	}
	if _, err := cl.Txn(ctx, clientv3.OpPut("jobs/claimed-record", "v1")); err != nil {
		t.Fatalf("Txn while held: %v", err)
	}
	for _, k := range []string{"jobs/claimed/.claim", "jobs/claimed/.run"} {
		if _, err := cl.Txn(ctx, clientv3.OpPut(k, "x")); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("Txn on %s: %v, want ErrInvalidArgument", k, err)
		}
	}
	if _, err := cli.Delete(ctx, "jobs/claimed/.run"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Txn(ctx, clientv3.OpPut("jobs/claimed-record", "stale")); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Txn after the claim key was deleted: %v, want ErrNotHeld", err)
	}
	if r, _ := cli.Get(ctx, "jobs/claimed-record"); len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v1" {
		t.Errorf("record %v after a refused write, want v1", r.Kvs)
	}
	if !errors.Is(context.Cause(cl.Context()), holdfast.ErrLost) {
		t.Errorf("claim context cause %v, want ErrLost", context.Cause(cl.Context()))
	}

	// The same period again: refused. The next one; released, its Txn is
	// refused locally.
	if g, err := o.Claim(ctx); !errors.Is(err, holdfast.ErrClaimed) {
		t.Fatalf("a claim of the same period after its run: %v %v, want ErrClaimed (the record)", g, err)
	}
	cl2, err := o.ClaimPeriod(ctx, cl.Period().Add(sched.Every))
	if err != nil {
		t.Fatal(err)
	}
	if cl2.Token() <= cl.Token() {
		t.Errorf("second token %d, want above %d", cl2.Token(), cl.Token())
	}
	if err := cl2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cl2.Txn(ctx, clientv3.OpPut("jobs/claimed-record", "late")); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Txn after Unlock: %v, want ErrNotHeld", err)
	}
	if err := cl2.Unlock(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("second Unlock: %v, want ErrNotHeld", err)
	}
	if g, err := o.ClaimPeriod(ctx, cl.Period()); !errors.Is(err, holdfast.ErrClaimed) {
		t.Errorf("a claim of an earlier period: %v %v, want ErrClaimed", g, err)
	}
	if ks, _ := cli.Get(ctx, "jobs/claimed/", clientv3.WithPrefix(), clientv3.WithKeysOnly()); len(ks.Kvs) != 1 || string(ks.Kvs[0].Key) != "jobs/claimed/.claim" {
		t.Errorf("keys left: %v, want the record alone", ks.Kvs)
	}
	leases, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 1 { // the session's
		t.Errorf("%d leases after Unlock and refused claims, want the session's alone", len(leases.Leases))
	}
}

// TestClaimBadInput: schedules etcd cannot serve are refused before any
// request.
func TestClaimBadInput(t *testing.T) {
	c := etcdtest.Etcd(t)
	s := newSession(t, c)
	for _, sched := range []holdfast.Schedule{
		{Every: 0, AtMost: 10 * time.Second},
		{Every: time.Minute, AtLeast: 20 * time.Second, AtMost: 10 * time.Second},
		{Every: time.Minute, AtMost: time.Second},
	} {
		if _, err := etcd.NewOnce(s, "jobs/bad", sched); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("NewOnce(%+v): %v, want ErrInvalidArgument", sched, err)
		}
	}
	if _, err := etcd.NewOnce(s, "/bad", holdfast.Schedule{Every: time.Minute, AtMost: 10 * time.Second}); !errors.Is(err, holdfast.ErrInvalidName) {
		t.Errorf("bad name: %v, want ErrInvalidName", err)
	}
	o, _ := etcd.NewOnce(s, "jobs/bad", holdfast.Schedule{Every: time.Minute, AtMost: 10 * time.Second})
	//lint:ignore SA1012 a nil context is the bad input under test
	if _, err := o.Claim(nil); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("nil context: %v, want ErrInvalidArgument", err)
	}
}

// TestClaimOldFormat: a claim key of an older holdfast ("<name>/.claim"
// with a lease and a JSON value) refuses claims, saying so, until its
// lease ends; then a claim succeeds and writes the record in its place.
func TestClaimOldFormat(t *testing.T) {
	c := etcdtest.Etcd(t)
	cli := c.Client(t)
	ctx := context.Background()
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "jobs/old/.claim", `{"period":"2026-11-25T10:00:00Z","lease":"1"}`, clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	s := newSession(t, c)
	o, err := etcd.NewOnce(s, "jobs/old", holdfast.Schedule{Every: time.Hour, AtMost: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g, err := o.Claim(ctx); !errors.Is(err, holdfast.ErrClaimed) || !strings.Contains(err.Error(), "older holdfast") {
		t.Fatalf("claim over an old claim key: %v %v, want ErrClaimed saying it is an older holdfast's", g, err)
	}
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	g, err := o.Claim(ctx)
	if err != nil {
		t.Fatalf("claim once the old key expired: %v", err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if r, _ := cli.Get(ctx, "jobs/old/.claim"); len(r.Kvs) != 1 || r.Kvs[0].Lease != 0 || !strings.HasSuffix(string(r.Kvs[0].Value), "Z") {
		t.Errorf("record %v, want the new record without a lease", r.Kvs)
	}
}

// TestClaimAnswerLost: a claim transaction that etcd applied but whose
// answer was lost still gives its claim (the run's mark read back carries
// the claim's lease), so the claimant runs rather than every replica
// finding the period taken and nobody running it; the one lease left is
// the claim's, and Unlock revokes it.
func TestClaimAnswerLost(t *testing.T) {
	c := etcdtest.Etcd(t)
	f := etcdtest.NewFaults()
	cli := c.Client(t, f.Install)
	s, err := etcd.NewSession(context.Background(), cli)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o, err := etcd.NewOnce(s, "jobs/answerlost", holdfast.Schedule{Every: time.Hour, AtMost: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	hit := f.Inject(etcdtest.Rule{Method: "/etcdserverpb.KV/Txn", Mode: etcdtest.LoseAnswer})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := o.Claim(ctx)
	if !hit() {
		t.Fatal("the fault did not hit the claim's transaction")
	}
	if err != nil {
		t.Fatalf("claim whose transaction applied without an answer: %v", err)
	}
	admin := c.Client(t)
	resp, err := admin.Get(ctx, "jobs/answerlost/.run")
	if err != nil || len(resp.Kvs) != 1 || int64(cl.Token()) != resp.Kvs[0].CreateRevision {
		t.Fatalf("run mark %v (%v), want one at the claim's token %d", resp, err, cl.Token())
	}
	if err := cl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if resp, err := admin.Get(ctx, "jobs/answerlost/.run"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("run mark after Unlock: %v %v", resp, err)
	}
}
