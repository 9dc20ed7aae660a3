package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/etcd"
)

// Open a session in one line: Dial owns its client, and Close closes it.
func ExampleDial() {
	forUnitTestsRunInMockedContext(mockDial, func() {
		ctx := context.Background()
		s, err := etcd.Dial(ctx, endpoints, etcd.WithTTL(10*time.Second))
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		fmt.Println("session TTL:", s.TTL())
	})
	// Output:
	// session TTL: 10s
}

// Take a lock, write under it, release it: the lines the package doc
// shows.
func ExampleMutex_Lock() {
	forUnitTestsRunInMockedContext(mockMutex_Lock, func() {
		ctx := context.Background()
		s, err := etcd.Dial(ctx, endpoints) // one lease, kept alive, for every lock of the process
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		m, err := etcd.NewMutex(s, "jobs/nightly-report")
		if err != nil {
			log.Fatal(err)
		}
		g, err := m.Lock(ctx) // waits its turn; g.Context() ends if the lock is lost
		if err != nil {
			log.Fatal(err)
		}
		defer func() {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = g.Unlock(uctx) // if etcd does not answer in time, the session releases it later
		}()
		// g.Token() fences writes elsewhere; g.Txn commits only while the lock is held.
		record := fmt.Sprintf("done under token %d", g.Token())
		if _, err := g.Txn(g.Context(), clientv3.OpPut("reports/last", record)); err != nil {
			log.Fatal(err)
		}

		var fence holdfast.Fence // what a fenced resource does with the token
		fmt.Println("admitted:", fence.Admit(g.Token()) == nil)
		fmt.Println("still held:", g.Context().Err() == nil)
	})
	// Output:
	// admitted: true
	// still held: true
}

// A guarded write commits only while the lock is held.
func ExampleGrant_Txn() {
	forUnitTestsRunInMockedContext(mockGrant_Txn, func() {
		cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			log.Fatal(err)
		}
		defer cli.Close()
		ctx := context.Background()

		s, err := etcd.NewSession(ctx, cli)
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		m, _ := etcd.NewMutex(s, "locks/config")
		g, err := m.Lock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := g.Txn(ctx, clientv3.OpPut("config/leader", "me")); err != nil {
			log.Fatal(err)
		}
		fmt.Println("write while held: ok")

		_, err = g.Txn(ctx, clientv3.OpPut(g.Key(), "x"))
		fmt.Println("write to the lock's own key refused:", errors.Is(err, holdfast.ErrInvalidArgument))

		_ = g.Unlock(ctx)
		_, err = g.Txn(ctx, clientv3.OpPut("config/leader", "stale"))
		fmt.Println("write after unlock refused:", errors.Is(err, holdfast.ErrNotHeld))
	})
	// Output:
	// write while held: ok
	// write to the lock's own key refused: true
	// write after unlock refused: true
}

// TryLock fails at once when the lock is taken.
func ExampleMutex_TryLock() {
	forUnitTestsRunInMockedContext(mockMutex_TryLock, func() {
		cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			log.Fatal(err)
		}
		defer cli.Close()
		ctx := context.Background()

		s1, _ := etcd.NewSession(ctx, cli)
		defer s1.Close()
		s2, _ := etcd.NewSession(ctx, cli)
		defer s2.Close()
		m1, _ := etcd.NewMutex(s1, "locks/once")
		m2, _ := etcd.NewMutex(s2, "locks/once")

		g, err := m1.TryLock(ctx)
		fmt.Println("first:", err)
		_, err = m2.TryLock(ctx)
		fmt.Println("second locked:", errors.Is(err, holdfast.ErrLocked))
		_ = g.Unlock(ctx)
	})
	// Output:
	// first: <nil>
	// second locked: true
}

// At most 2 workers of the fleet at once: each process takes a permit
// through its own session (one permit per session and name at a time).
func ExampleSemaphore() {
	forUnitTestsRunInMockedContext(mockSemaphore, func() {
		cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			log.Fatal(err)
		}
		defer cli.Close()
		ctx := context.Background()

		var permits []*etcd.Grant
		for i := range 3 {
			s, err := etcd.NewSession(ctx, cli) // in real code, one per process
			if err != nil {
				log.Fatal(err)
			}
			defer s.Close()
			sem, err := etcd.NewSemaphore(s, "jobs/encoders", 2)
			if err != nil {
				log.Fatal(err)
			}
			g, err := sem.TryLock(ctx) // Lock would wait for a permit
			if err != nil {
				fmt.Printf("worker %d: full: %v\n", i, errors.Is(err, holdfast.ErrLocked))
				continue
			}
			// Work under g.Context(), fenced with g.Token(); Unlock when done.
			fmt.Printf("worker %d: permit\n", i)
			permits = append(permits, g)
		}
		for _, g := range permits {
			_ = g.Unlock(ctx)
		}
	})
	// Output:
	// worker 0: permit
	// worker 1: permit
	// worker 2: full: true
}

// Readers share the lock; a writer excludes everyone; a writer can
// downgrade to a reader without letting another writer in.
func ExampleRWMutex() {
	forUnitTestsRunInMockedContext(mockRWMutex, func() {
		cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			log.Fatal(err)
		}
		defer cli.Close()
		ctx := context.Background()

		s1, _ := etcd.NewSession(ctx, cli)
		defer s1.Close()
		s2, _ := etcd.NewSession(ctx, cli)
		defer s2.Close()
		rw1, _ := etcd.NewRWMutex(s1, "config/routes")
		rw2, _ := etcd.NewRWMutex(s2, "config/routes")

		w, err := rw1.Lock(ctx) // write: rebuild the routes
		if err != nil {
			log.Fatal(err)
		}
		_, err = rw2.TryRLock(ctx)
		fmt.Println("reader while writing:", errors.Is(err, holdfast.ErrLocked))

		r, err := rw1.Downgrade(ctx, w) // keep reading what we wrote
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("same token:", r.Token() == w.Token())
		r2, err := rw2.TryRLock(ctx)
		fmt.Println("reader beside the downgraded writer:", err)
		_ = r2.Unlock(ctx)
		_ = r.Unlock(ctx)
	})
	// Output:
	// reader while writing: true
	// same token: true
	// reader beside the downgraded writer: <nil>
}

// The mocks print what each example prints against a real server
// (forUnitTestsRunInMockedContext).

func mockDial() {
	fmt.Println("session TTL: 10s")
}

func mockMutex_Lock() {
	fmt.Println("admitted: true")
	fmt.Println("still held: true")
}

func mockGrant_Txn() {
	fmt.Println("write while held: ok")
	fmt.Println("write to the lock's own key refused: true")
	fmt.Println("write after unlock refused: true")
}

func mockMutex_TryLock() {
	fmt.Println("first: <nil>")
	fmt.Println("second locked: true")
}

func mockSemaphore() {
	fmt.Println("worker 0: permit")
	fmt.Println("worker 1: permit")
	fmt.Println("worker 2: full: true")
}

func mockRWMutex() {
	fmt.Println("reader while writing: true")
	fmt.Println("same token: true")
	fmt.Println("reader beside the downgraded writer: <nil>")
}
