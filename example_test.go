package holdfast_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
)

// A resource guarded by a Fence accepts writes in token order: a holder
// whose grant has passed to someone else (an older token) is refused, even if
// its write arrives last.
func ExampleFence() {
	var f holdfast.Fence
	balance := 0
	write := func(holder string, token holdfast.Token, amount int) {
		err := f.Do(token, func() { balance += amount })
		switch {
		case errors.Is(err, holdfast.ErrStaleToken):
			fmt.Printf("%s (token %v): refused, a newer holder has written\n", holder, token)
		case err != nil:
			fmt.Printf("%s (token %v): %v\n", holder, token, err)
		default:
			fmt.Printf("%s (token %v): balance %d\n", holder, token, balance)
		}
	}

	write("A", 101, 10) // A holds the lock
	write("A", 101, 5)  // A writes again under the same grant
	write("B", 107, 1)  // A's grant was lost; B got the lock
	write("A", 101, 99) // A, paused meanwhile, wakes up and writes late
	fmt.Println("highest token seen:", f.Max())
	// Output:
	// A (token 101): balance 10
	// A (token 101): balance 15
	// B (token 107): balance 16
	// A (token 101): refused, a newer holder has written
	// highest token seen: 107
}

func ExampleValidateName() {
	for _, name := range []string{"locks/orders", "locks/orders/", "locks//orders", "my lock", ""} {
		err := holdfast.ValidateName(name)
		fmt.Printf("%q: valid %v, ErrInvalidArgument %v\n", name, err == nil, errors.Is(err, holdfast.ErrInvalidArgument))
	}
	fmt.Println(holdfast.ValidateName("locks//orders"))
	// Output:
	// "locks/orders": valid true, ErrInvalidArgument false
	// "locks/orders/": valid false, ErrInvalidArgument true
	// "locks//orders": valid false, ErrInvalidArgument true
	// "my lock": valid false, ErrInvalidArgument true
	// "": valid false, ErrInvalidArgument true
	// holdfast: invalid argument: invalid name: "locks//orders" has an empty path segment
}

// AsLocker adapts a backend's lock to a holdfast.Locker, for code that should
// not depend on the store (here Consul's).
func ExampleAsLocker() {
	forExamplesRunAgainstAnAgent(func(addr string) {
		ctx := context.Background()
		s, err := consul.Dial(ctx, addr, consul.WithLockDelay(0))
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		m, err := consul.NewMutex(s, "jobs/nightly")
		if err != nil {
			log.Fatal(err)
		}

		var l holdfast.Locker = holdfast.AsLocker(m)
		g, err := l.TryLock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		_, isConsul := g.(*consul.Grant) // the backend's grant, unchanged
		fmt.Println("locked:", g.Token() > 0, "consul grant:", isConsul)
		fmt.Println("unlock:", g.Unlock(ctx))
	})
	// Output:
	// locked: true consul grant: true
	// unlock: <nil>
}

// forExamplesRunAgainstAnAgent runs an example's body against a real
// `consul agent -dev` started for it and stopped after it; addr is the
// agent's HTTP address, where your code has yours ("" for
// $CONSUL_HTTP_ADDR, else 127.0.0.1:8500). The body is the code a user
// writes.
func forExamplesRunAgainstAnAgent(example func(addr string)) {
	agent, err := embedtest.StartConsul()
	if err != nil {
		log.Fatal(err)
	}
	defer agent.Close()
	example(agent.HTTPAddr)
}
