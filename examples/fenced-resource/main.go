// Command fenced-resource shows the resource side of fencing: storage that
// refuses a write from a holder that has lost its lock.
//
// Two workers share one lock on an embedded etcd. worker-1 holds it and sends
// a write that is slow to arrive (a slow network, a retry queue, a paused
// client). Meanwhile its lock is lost: an operator revokes its lease, as if
// it had expired. worker-2 gets the lock and writes. When worker-1's write
// finally reaches the storage, it carries an older fencing token than one the
// storage has already seen, and is rejected. worker-1's grant context tells
// it that it lost the lock, but that cannot recall a write already sent: only
// the storage's token check catches it.
//
//	go run ./examples/fenced-resource
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "fenced-resource:", err)
		os.Exit(1)
	}
}

// storage is the protected resource, in memory. A real one keeps the highest
// token next to its data (a column, object metadata) and checks it in the
// same transaction as the write.
type storage struct {
	fence holdfast.Fence // refuses tokens lower than the highest it admitted
	mu    sync.Mutex
	value string
}

func (s *storage) Write(token holdfast.Token, value string) error {
	return s.fence.Do(token, func() { s.mu.Lock(); s.value = value; s.mu.Unlock() })
}

func run(ctx context.Context, stdout io.Writer, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("no arguments expected, got %q", args)
	}
	cluster, err := etcdtest.StartEtcd("", 1) // in a temporary directory, removed by Close
	if err != nil {
		return err
	}
	defer cluster.Close()
	fmt.Fprintf(stdout, "embedded etcd at %s (temporary directory)\n", cluster.Endpoints()[0])
	var sessions [2]*etcd.Session // worker-1's and worker-2's, each on its own client
	var mutexes [2]*etcd.Mutex
	for i := range sessions {
		cli, err := cluster.NewClient()
		if err != nil {
			return err
		}
		defer cli.Close()
		if sessions[i], err = etcd.NewSession(ctx, cli, etcd.WithTTL(etcd.MinTTL)); err != nil {
			return err
		}
		defer sessions[i].Close()
		if mutexes[i], err = etcd.NewMutex(sessions[i], "locks/report"); err != nil {
			return err
		}
	}

	start := time.Now()
	log := func(who, format string, a ...any) {
		fmt.Fprintf(stdout, "%5d ms  %-8s  %s\n", time.Since(start).Milliseconds(), who, fmt.Sprintf(format, a...))
	}
	var store storage
	g1, err := mutexes[0].Lock(ctx)
	if err != nil {
		return err
	}
	log("worker-1", "holds the lock (token %d)", g1.Token())
	lostAt := make(chan time.Duration, 1) // when worker-1 is told it lost the lock
	context.AfterFunc(g1.Context(), func() { lostAt <- time.Since(start) })
	if err := store.Write(g1.Token(), "v1 by worker-1"); err != nil {
		return err
	}
	log("storage", "accepted v1 from worker-1 (token %d)", g1.Token())

	// worker-1 sends v2: it leaves now, but reaches the storage only when `arrive` is closed.
	arrive, result := make(chan struct{}), make(chan error, 1)
	go func() { <-arrive; result <- store.Write(g1.Token(), "v2 by worker-1") }()
	log("worker-1", "sends v2 (token %d), slow to arrive", g1.Token())

	type grant struct {
		g   holdfast.Grant
		err error
	}
	got := make(chan grant, 1)
	go func() { g, err := mutexes[1].Lock(ctx); got <- grant{g, err} }()
	log("worker-2", "waits for the lock")

	// worker-1's lease is revoked from another client (worker-2's here, an
	// operator's `etcdctl lease revoke` in real life), as if it had expired.
	if _, err := sessions[1].Client().Revoke(ctx, sessions[0].Lease()); err != nil {
		return err
	}
	log("operator", "revoked worker-1's lease")
	r := <-got
	if r.err != nil {
		return r.err
	}
	g2 := r.g
	defer g2.Unlock(context.WithoutCancel(ctx))
	log("worker-2", "holds the lock (token %d)", g2.Token())
	if err := store.Write(g2.Token(), "v3 by worker-2"); err != nil {
		return err
	}
	log("storage", "accepted v3 from worker-2 (token %d)", g2.Token())

	close(arrive) // worker-1's v2 arrives at last
	stale := 0
	if err := <-result; errors.Is(err, holdfast.ErrStaleToken) {
		stale++
		log("storage", "REJECTED v2 from worker-1: %v", err)
	} else {
		log("storage", "ACCEPTED v2 from worker-1 (error %v): fencing failed", err)
	}
	select {
	case at := <-lostAt: // usually later than all of the above
		fmt.Fprintf(stdout, "%5d ms  worker-1  is told: %v\n", at.Milliseconds(), context.Cause(g1.Context()))
	case <-time.After(5 * time.Second):
		log("worker-1", "was not told it lost the lock within 5 s")
	}
	log("worker-1", "Unlock: %v", g1.Unlock(ctx))
	store.mu.Lock()
	fmt.Fprintf(stdout, "storage holds %q (highest token %d)\n", store.value, store.fence.Max())
	store.mu.Unlock()
	fmt.Fprintf(stdout, "stale writes rejected: %d\n", stale)
	if stale != 1 {
		return errors.New("the stale write was not rejected")
	}
	return nil
}
