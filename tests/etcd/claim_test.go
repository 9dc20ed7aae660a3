package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// TestClaimGuardedTxn: a claim's key and token are "<name>/.claim" and its
// create revision; Claim.Txn commits while the claim is held, refuses ops on
// the claim's key, and once the key was deleted from outside (which the
// claim does not watch) or the claim released, applies nothing and returns
// ErrNotHeld.
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
	cl, err := o.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "jobs/claimed/.claim")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("claim key: %v %v", resp, err)
	}
	if cl.Key() != "jobs/claimed/.claim" || int64(cl.Token()) != resp.Kvs[0].CreateRevision || !cl.Period().Equal(sched.Period(time.Now())) {
		t.Errorf("key %q token %d period %v: want the claim key, its create revision %d, this period", cl.Key(), cl.Token(), cl.Period(), resp.Kvs[0].CreateRevision)
	}
	if _, err := cl.Txn(ctx, clientv3.OpPut("jobs/claimed-record", "v1")); err != nil {
		t.Fatalf("Txn while held: %v", err)
	}
	if _, err := cl.Txn(ctx, clientv3.OpPut("jobs/claimed/.claim", "x")); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("Txn on the claim key: %v, want ErrInvalidArgument", err)
	}
	if _, err := cli.Delete(ctx, "jobs/claimed/.claim"); err != nil {
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

	// A new claim; released, its Txn is refused locally.
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
	if _, err := cl2.Txn(ctx, clientv3.OpPut("jobs/claimed-record", "late")); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Txn after Unlock: %v, want ErrNotHeld", err)
	}
	if err := cl2.Unlock(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("second Unlock: %v, want ErrNotHeld", err)
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
