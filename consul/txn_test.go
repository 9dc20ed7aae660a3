package consul

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
)

func setOp(key, value string) *api.TxnOp {
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVSet, Key: key, Value: []byte(value)}}
}

// value reads key ("" if absent).
func value(t *testing.T, c *api.Client, key string) string {
	t.Helper()
	pair, _, err := c.KV().Get(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pair == nil {
		return ""
	}
	return string(pair.Value)
}

// TestGuardedTxn: Grant.Txn applies while the grant is held, refuses with
// ErrNotHeld and applies nothing once it is not (in Consul, or locally), and
// reports failures of its own operations with their indexes.
func TestGuardedTxn(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	name := uniqueName(t)
	data, other := name+"-data", name+"-other"
	t.Cleanup(func() {
		_, _ = admin.KV().Delete(data, nil)
		_, _ = admin.KV().Delete(other, nil)
	})
	s := newSession(t, a.Client(t), WithLockDelay(0))
	m := newMutex(t, s, name)
	g, err := m.Lock(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := timeout(t, 10*time.Second)

	// Held: applied, and the results are those of our operations.
	resp, err := g.Txn(ctx, api.TxnOps{setOp(data, "v1"), setOp(other, "o1")})
	if err != nil {
		t.Fatalf("Txn while held: %v", err)
	}
	if len(resp.Results) != 2 || resp.Results[0].KV.Key != data || resp.Results[1].KV.Key != other {
		t.Errorf("results: %+v, want those of our two sets", resp.Results)
	}
	if v := value(t, admin, data); v != "v1" {
		t.Errorf("data = %q after a guarded write, want v1", v)
	}

	// One of our operations fails: nothing applied, its index is ours.
	resp, err = g.Txn(ctx, api.TxnOps{
		setOp(data, "v2"),
		{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: other, Value: []byte("o2"), Index: 1}},
	})
	if err == nil || errors.Is(err, holdfast.ErrNotHeld) {
		t.Fatalf("Txn with a stale cas: %v, want an error other than ErrNotHeld", err)
	}
	t.Log(err)
	if resp == nil || len(resp.Errors) != 1 || resp.Errors[0].OpIndex != 1 {
		t.Errorf("response of a failed Txn: %+v, want one error at op 1", resp)
	}
	if v := value(t, admin, data); v != "v1" {
		t.Errorf("data = %q after a rolled-back Txn, want v1", v)
	}
	if g.Context().Err() != nil {
		t.Errorf("grant lost after one of our own operations failed: %v", context.Cause(g.Context()))
	}

	// The lock key is taken from under us (deleted from outside): the
	// guard fails in Consul although we were not told.
	if _, err := admin.KV().Delete(LockKey(name), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Txn(ctx, api.TxnOps{setOp(data, "v3")}); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Txn after the lock key was deleted: %v, want ErrNotHeld", err)
	}
	if v := value(t, admin, data); v != "v1" {
		t.Errorf("data = %q after a refused Txn, want v1", v)
	}
	if cause := context.Cause(g.Context()); !errors.Is(cause, holdfast.ErrLost) {
		t.Errorf("grant context cause after a failed guard: %v, want ErrLost", cause)
	}
	if err := g.Unlock(ctx); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Unlock after the loss: %v, want ErrNotHeld", err)
	}

	// A new grant; its session is destroyed.
	g, err = m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Txn(ctx, api.TxnOps{setOp(data, "v4")}); err != nil {
		t.Fatal(err)
	}
	destroy(t, admin, s.ID())
	select {
	case <-g.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("grant context not done 5 s after its session was destroyed")
	}
	if _, err := g.Txn(ctx, api.TxnOps{setOp(data, "v5")}); !errors.Is(err, holdfast.ErrNotHeld) {
		t.Errorf("Txn after the session was destroyed: %v, want ErrNotHeld", err)
	}
	if v := value(t, admin, data); v != "v4" {
		t.Errorf("data = %q after the session was destroyed, want v4", v)
	}

	// Bad input.
	for _, ops := range []api.TxnOps{nil, make(api.TxnOps, MaxTxnOps-1), {nil}} {
		if _, err := g.Txn(ctx, ops); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("Txn with %d ops: %v, want ErrInvalidArgument", len(ops), err)
		}
	}
}
