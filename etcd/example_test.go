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
		endpoints, _, stop := startEtcd()
		defer stop()
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

// Take a lock, do fenced work under the grant's context, release it.
func ExampleMutex_Lock() {
	forUnitTestsRunInMockedContext(mockMutex_Lock, func() {
		_, cli, stop := startEtcd()
		defer stop()
		ctx := context.Background()

		s, err := etcd.NewSession(ctx, cli) // one lease, shared by every lock of the process
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		m, err := etcd.NewMutex(s, "locks/nightly-report")
		if err != nil {
			log.Fatal(err)
		}
		g, err := m.Lock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer func() {
			// Unlock's context bounds only the wait for etcd's answer; if it
			// ends first, the session finishes the release in the background.
			uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := g.Unlock(uctx); err != nil {
				log.Print(err)
			}
		}()

		// Run the work under g.Context(): it is cancelled if the lock is lost.
		// Send g.Token() with every write so the resource can refuse stale ones.
		var fence holdfast.Fence
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
		_, cli, stop := startEtcd()
		defer stop()
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
		_, cli, stop := startEtcd()
		defer stop()
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
		_, cli, stop := startEtcd()
		defer stop()
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
		_, cli, stop := startEtcd()
		defer stop()
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
