package semaphore_test

import (
	"context"
	"fmt"
	"log"
	"sync/atomic"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/semaphore"
)

// Run 20 jobs, at most 2 at once in this process (2 lockers, each on a
// session of its own) and at most 4, the semaphore's limit, across the
// fleet.
func ExampleGroup() {
	// A throwaway Consul agent; in real code, dial your own.
	agent, err := embedtest.StartConsul()
	if err != nil {
		log.Fatal(err)
	}
	defer agent.Close()
	ctx := context.Background()

	const slots = 2
	lockers := make([]holdfast.Locker, slots)
	for i := range lockers {
		s, err := consul.Dial(ctx, agent.HTTPAddr, consul.WithLockDelay(0)) // one session per slot
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		// At most 4 encoders across every process, whatever their slots.
		sem, err := consul.NewSemaphore(s, "jobs/encode", 4)
		if err != nil {
			log.Fatal(err)
		}
		lockers[i] = holdfast.AsLocker[*consul.Grant](sem)
	}

	g, err := semaphore.NewGroup(ctx, lockers...)
	if err != nil {
		log.Fatal(err)
	}
	var done atomic.Int32
	for range 20 {
		g.Go(func(ctx context.Context) error {
			p := semaphore.Permit(ctx) // its Token fences the job's writes
			_ = p.Token()
			// ... work under ctx, cancelled if the permit is lost ...
			done.Add(1)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("jobs done:", done.Load())
	// Output:
	// jobs done: 20
}
