// Command quickstart is the README's first example, compiled and tested: it
// takes a lock on etcd and on Consul, writes a record under the lock with a
// guarded write, and unlocks. With no flags it starts its own servers (an
// embedded etcd, and a Consul agent if one can be found through
// scripts/consul.sh or CONSUL_BIN); with -etcd or -consul it uses yours.
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -etcd 127.0.0.1:2379 -consul 127.0.0.1:8500
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// README: etcd
func lockEtcd(ctx context.Context, endpoints []string) error {
	s, err := etcd.Dial(ctx, endpoints, etcd.WithTTL(15*time.Second)) // one lease for every lock of the process
	if err != nil {
		return err
	}
	defer s.Close()

	m, err := etcd.NewMutex(s, "locks/nightly-report")
	if err != nil {
		return err
	}
	g, err := m.Lock(ctx) // first come, first served; ctx bounds the wait
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Unlock(ctx) // bounded: if etcd is slow, the release goes on in the background
	}()

	// g.Context() is cancelled before anyone else can get the lock; the token
	// fences writes; g.Txn commits only while the lock is held.
	record := fmt.Sprintf("done under token %d", g.Token())
	_, err = g.Txn(g.Context(), clientv3.OpPut("reports/last", record))
	return err
}

// README: consul
func lockConsul(ctx context.Context, addr string) error {
	s, err := consul.Dial(ctx, addr, consul.WithLockDelay(0)) // one session for every lock of the process
	if err != nil {
		return err
	}
	defer s.Close()

	m, err := consul.NewMutex(s, "locks/nightly-report")
	if err != nil {
		return err
	}
	g, err := m.Lock(ctx)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Unlock(ctx)
	}()

	record := fmt.Sprintf("done under token %d", g.Token())
	_, err = g.Txn(g.Context(), api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: "reports/last", Value: []byte(record)}},
	})
	return err
}

// README: any
// runOnce runs job under l, whatever the store: code that takes a
// holdfast.Locker does not change meaning with the backend.
func runOnce(ctx context.Context, l holdfast.Locker, job func(ctx context.Context, token holdfast.Token) error) error {
	g, err := l.TryLock(ctx)
	if err != nil {
		return err // errors.Is(err, holdfast.ErrLocked): someone else runs it
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = g.Unlock(ctx)
	}()
	return job(g.Context(), g.Token())
}

// README: end

func main() {
	etcdAddr := flag.String("etcd", "", "etcd endpoint (default: start an embedded one)")
	consulAddr := flag.String("consul", "", "Consul HTTP address (default: start an agent if its binary can be found)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, *etcdAddr, *consulAddr); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, etcdAddr, consulAddr string) error {
	if etcdAddr == "" {
		c, err := etcdtest.StartEtcd("", 1)
		if err != nil {
			return err
		}
		defer c.Close()
		etcdAddr = c.Endpoint(0)
	}
	if err := lockEtcd(ctx, []string{etcdAddr}); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	fmt.Println("etcd: locked, wrote reports/last under the lock, unlocked")

	s, err := etcd.Dial(ctx, []string{etcdAddr})
	if err != nil {
		return err
	}
	defer s.Close()
	m, err := etcd.NewMutex(s, "locks/cleanup")
	if err != nil {
		return err
	}
	err = runOnce(ctx, holdfast.AsLocker(m), func(ctx context.Context, token holdfast.Token) error {
		fmt.Println("etcd: cleanup ran once under token", token)
		return nil
	})
	if err != nil {
		return err
	}

	if consulAddr == "" {
		a, err := embedtest.StartConsul()
		if err != nil {
			fmt.Fprintln(os.Stderr, "consul: skipped, no agent:", err)
			return nil
		}
		defer a.Close()
		consulAddr = a.HTTPAddr
	}
	if err := lockConsul(ctx, consulAddr); err != nil {
		return fmt.Errorf("consul: %w", err)
	}
	fmt.Println("consul: locked, wrote reports/last under the lock, unlocked")
	return nil
}
