package etcd_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// Go benchmarks of the hot paths, against an embedded etcd, for comparing
// commits with benchstat:
//
//	go test -tags holdfast_testhooks -run '^$' -bench . -count 10 ./tests/etcd/ > new.txt
//	benchstat old.txt new.txt
//
// They measure one client on an existing session; the contended scenarios,
// side by side with the native recipes, are in `holdfast bench`.

// BenchmarkLockUnlock: an uncontended Lock and Unlock of one lock.
func BenchmarkLockUnlock(b *testing.B) {
	c := etcdtest.Etcd(b)
	s, err := etcd.NewSession(context.Background(), c.Client(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	m, err := etcd.NewMutex(s, "bench/lock")
	if err != nil {
		b.Fatal(err)
	}
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
	c := etcdtest.Etcd(b)
	s, err := etcd.NewSession(context.Background(), c.Client(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	m, err := etcd.NewMutex(s, "bench/txn")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	g, err := m.Lock(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Unlock(ctx)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Txn(ctx, clientv3.OpPut("bench/record", "x")); err != nil {
			b.Fatal(err)
		}
	}
}
