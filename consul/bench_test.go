package consul

import (
	"context"
	"testing"

	"github.com/hashicorp/consul/api"
)

// Go benchmarks of the hot paths, against the shared Consul dev agent, for
// comparing commits with benchstat:
//
//	go test -run '^$' -bench . -count 10 ./consul/ > new.txt
//	benchstat old.txt new.txt
//
// They measure one client on an existing session; the contended scenarios,
// side by side with api.Lock and api.Semaphore, are in `holdfast bench`.

// BenchmarkLockUnlock: an uncontended Lock and Unlock of one lock.
func BenchmarkLockUnlock(b *testing.B) {
	a := agent(b)
	s := newSession(b, a.Client(b))
	m := newMutex(b, s, uniqueName(b))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		g, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuardedTxn: a guarded write through a held grant.
func BenchmarkGuardedTxn(b *testing.B) {
	a := agent(b)
	s := newSession(b, a.Client(b))
	m := newMutex(b, s, uniqueName(b))
	ctx := context.Background()
	g, err := m.Lock(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Unlock(ctx)
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: "bench/record", Value: []byte("x")}}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Txn(ctx, ops); err != nil {
			b.Fatal(err)
		}
	}
}
