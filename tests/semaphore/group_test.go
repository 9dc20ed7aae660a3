package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/embedtest/leakcheck"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/semaphore"
)

// store makes lockers of one kind on one store, each on a session of its
// own, as separate processes would have.
type store struct {
	// limit is the store's limit for the lockers newLocker makes.
	limit int
	// newLocker returns a locker on a new session, and a function that
	// ends that session from outside (a revoked lease).
	newLocker func(t *testing.T, name string) (holdfast.Locker, func())
	// keys lists the keys under name + "/".
	keys func(t *testing.T, name string) []string
}

// etcdStore is an embedded etcd; mk makes the locker of a session.
func etcdStore(t *testing.T, limit int, mk func(s *etcd.Session, name string) (holdfast.Locker, error)) store {
	c := etcdtest.Etcd(t)
	admin := c.Client(t)
	return store{
		limit: limit,
		newLocker: func(t *testing.T, name string) (holdfast.Locker, func()) {
			t.Helper()
			s, err := etcd.NewSession(context.Background(), c.Client(t), etcd.WithTTL(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			l, err := mk(s, name)
			if err != nil {
				t.Fatal(err)
			}
			return l, func() {
				if _, err := admin.Revoke(context.Background(), s.Lease()); err != nil {
					t.Errorf("revoke: %v", err)
				}
			}
		},
		keys: func(t *testing.T, name string) []string {
			resp, err := admin.Get(context.Background(), name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				t.Errorf("list keys: %v", err)
				return nil
			}
			var ks []string
			for _, kv := range resp.Kvs {
				ks = append(ks, string(kv.Key))
			}
			sort.Strings(ks)
			return ks
		},
	}
}

// etcdMutexes is a store whose limit is 1: every locker is a Mutex.
func etcdMutexes(t *testing.T) store {
	return etcdStore(t, 1, func(s *etcd.Session, name string) (holdfast.Locker, error) {
		m, err := etcd.NewMutex(s, name)
		if err != nil {
			return nil, err
		}
		return holdfast.AsLocker[*etcd.Grant](m), nil
	})
}

// etcdSemaphores is a store whose lockers are etcd Semaphores with limit.
func etcdSemaphores(limit int) func(t *testing.T) store {
	return func(t *testing.T) store {
		return etcdStore(t, limit, func(s *etcd.Session, name string) (holdfast.Locker, error) {
			sem, err := etcd.NewSemaphore(s, name, limit)
			if err != nil {
				return nil, err
			}
			return holdfast.AsLocker[*etcd.Grant](sem), nil
		})
	}
}

// consulSemaphores is a Consul agent whose lockers are Consul Semaphores
// with limit, each on a session of its own (TTL 10 s, lock-delay 0).
func consulSemaphores(limit int) func(t *testing.T) store {
	return func(t *testing.T) store {
		a := embedtest.Consul(t)
		admin := a.Client(t)
		return store{
			limit: limit,
			newLocker: func(t *testing.T, name string) (holdfast.Locker, func()) {
				t.Helper()
				s, err := consul.NewSession(context.Background(), a.Client(t), consul.WithTTL(10*time.Second), consul.WithLockDelay(0))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				sem, err := consul.NewSemaphore(s, name, limit)
				if err != nil {
					t.Fatal(err)
				}
				return holdfast.AsLocker[*consul.Grant](sem), func() {
					if _, err := admin.Session().Destroy(s.ID(), nil); err != nil {
						t.Errorf("destroy session: %v", err)
					}
				}
			},
			keys: func(t *testing.T, name string) []string {
				ks, _, err := admin.KV().Keys(name+"/", "", nil)
				if err != nil {
					t.Errorf("list keys: %v", err)
					return nil
				}
				sort.Strings(ks)
				return ks
			},
		}
	}
}

// stores are the stores every Group test runs on.
func stores() []struct {
	name string
	mk   func(t *testing.T) store
} {
	return []struct {
		name string
		mk   func(t *testing.T) store
	}{
		{"etcd-mutex", etcdMutexes},
		{"etcd-semaphore-4", etcdSemaphores(4)},
		{"consul-semaphore-4", consulSemaphores(4)},
	}
}

// lockers returns k lockers of name on sessions of their own, and their
// kill functions.
func (st store) lockers(t *testing.T, name string, k int) ([]holdfast.Locker, []func()) {
	ls := make([]holdfast.Locker, k)
	kills := make([]func(), k)
	for i := range ls {
		ls[i], kills[i] = st.newLocker(t, name)
	}
	return ls, kills
}

// holders is the fenced counter: the permits whose functions run, counted
// by whether each permit's context is still live, so that a function that
// overstays a lost permit is not counted against the store.
type holders struct {
	limit int

	mu         sync.Mutex
	live       map[holdfast.Grant]bool
	max        int
	violations []string
}

func newHolders(limit int) *holders {
	return &holders{limit: limit, live: make(map[holdfast.Grant]bool)}
}

func (h *holders) enter(p holdfast.Grant) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.live[p] = true
	n := 0
	var tokens []string
	for g := range h.live {
		if g.Context().Err() == nil {
			n++
			tokens = append(tokens, g.Token().String())
		}
	}
	h.max = max(h.max, n)
	if n > h.limit {
		h.violations = append(h.violations, fmt.Sprintf("%d live permits at once (tokens %v), limit %d", n, tokens, h.limit))
	}
}

func (h *holders) leave(p holdfast.Grant) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.live, p)
}

func uniqueName(t *testing.T) string {
	return "test/semaphore/" + strings.ReplaceAll(t.Name(), "/", "-") + fmt.Sprintf("/%x", time.Now().UnixNano())
}

// TestGroupBound: 200 tasks from 3 groups (3 processes' worth of clients,
// 3 lockers each) never run more than the store's limit at once, all
// complete, every function runs under a live permit of the name, and the
// store never holds more contender keys than the 10 lockers (and a
// bookkeeping key); the limit is reached.
func TestGroupBound(t *testing.T) {
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			leakcheck.Check(t)
			st := sc.mk(t)
			name := uniqueName(t)
			const groups, perGroup, tasks = 3, 3, 200
			h := newHolders(st.limit)
			var ran atomic.Int32

			// Watch the number of keys while the groups run.
			stopKeys := make(chan struct{})
			var maxKeys int
			keysDone := make(chan struct{})
			go func() {
				defer close(keysDone)
				for {
					select {
					case <-stopKeys:
						return
					case <-time.After(5 * time.Millisecond):
					}
					maxKeys = max(maxKeys, len(st.keys(t, name)))
				}
			}()

			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			errs := make([]error, groups)
			for gi := range groups {
				ls, _ := st.lockers(t, name, perGroup)
				g, err := semaphore.NewGroup(ctx, ls...)
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range tasks / groups {
						g.Go(func(ctx context.Context) error {
							p := semaphore.Permit(ctx)
							if p == nil || !strings.HasPrefix(p.Key(), name+"/") || p.Token() == 0 {
								return fmt.Errorf("function runs under permit %v", p)
							}
							h.enter(p)
							defer h.leave(p)
							// Long enough that the limit is reached even
							// with slow handoffs on a loaded machine.
							time.Sleep(50 * time.Millisecond)
							ran.Add(1)
							return ctx.Err()
						})
					}
					errs[gi] = g.Wait()
				}()
			}
			// The remainder of tasks/groups, so that 200 run in all.
			ls, _ := st.lockers(t, name, 1)
			g, err := semaphore.NewGroup(ctx, ls...)
			if err != nil {
				t.Fatal(err)
			}
			for range tasks % groups {
				g.Go(func(ctx context.Context) error {
					p := semaphore.Permit(ctx)
					h.enter(p)
					defer h.leave(p)
					ran.Add(1)
					return nil
				})
			}
			if err := g.Wait(); err != nil {
				t.Errorf("group of the remainder: %v", err)
			}
			wg.Wait()
			close(stopKeys)
			<-keysDone
			for i, err := range errs {
				if err != nil {
					t.Errorf("group %d: Wait: %v", i, err)
				}
			}
			if n := ran.Load(); n != tasks {
				t.Errorf("%d functions completed, want %d", n, tasks)
			}
			for _, v := range h.violations {
				t.Error(v)
			}
			// One key per locker (10), and one bookkeeping key on Consul
			// ("<name>/.lock").
			if lockers := groups*perGroup + 1; maxKeys > lockers+1 {
				t.Errorf("up to %d keys under the name, want at most %d (one per locker, and a bookkeeping key)", maxKeys, lockers+1)
			}
			t.Logf("limit %d: up to %d functions at once, up to %d keys", st.limit, h.max, maxKeys)
			if h.max < st.limit {
				t.Errorf("at most %d functions ran at once, want the store's limit, %d, to be reached", h.max, st.limit)
			}
			waitKeys(t, st, name, 0)
		})
	}
}

// TestGroupFanIn: 10,000 tasks submitted at once by 10,000 goroutines put no
// more contender keys in the store than the group has lockers; cancelling
// the group's context then ends them all, without running them, and leaves
// no key.
func TestGroupFanIn(t *testing.T) {
	leakcheck.Check(t)
	st := etcdMutexes(t)
	name := uniqueName(t)
	const k, tasks = 3, 10000

	// Another client holds the name, so the group's lockers queue.
	other, _ := st.newLocker(t, name)
	og, err := other.Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ls, _ := st.lockers(t, name, k)
	g, err := semaphore.NewGroup(ctx, ls...)
	if err != nil {
		t.Fatal(err)
	}
	var ran, submitted atomic.Int32
	var wg sync.WaitGroup
	for range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.Go(func(context.Context) error { ran.Add(1); return nil })
			submitted.Add(1)
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	var ks []string
	for {
		ks = st.keys(t, name)
		if len(ks) == k+1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(ks) != k+1 {
		t.Fatalf("keys %q, want the holder's and one per locker (%d)", ks, k+1)
	}
	for range 10 {
		time.Sleep(20 * time.Millisecond)
		if ks := st.keys(t, name); len(ks) > k+1 {
			t.Fatalf("%d keys with %d tasks submitted: %q, want at most %d", len(ks), tasks, ks, k+1)
		}
	}
	if n := submitted.Load(); n > k {
		t.Errorf("%d calls of Go returned while every locker waited, want at most %d", n, k)
	}
	cancel()
	wg.Wait()
	err = g.Wait()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Wait after cancel: %v, want context.Canceled", err)
	}
	if n := ran.Load(); n != 0 {
		t.Errorf("%d functions ran without a permit", n)
	}
	if err := og.Unlock(t.Context()); err != nil {
		t.Error(err)
	}
	waitKeys(t, st, name, 0)
}

// waitKeys waits for n keys under name, bookkeeping keys (Consul's
// "<name>/.lock") left out.
func waitKeys(t *testing.T, st store, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ks := slices.DeleteFunc(st.keys(t, name), func(k string) bool { return strings.HasSuffix(k, "/.lock") })
		if len(ks) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys %q, want %d", ks, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGroupFirstError: the first error is Wait's, it cancels the group's
// context with itself as cause, functions still waiting for a permit are
// not run, and every permit is released.
func TestGroupFirstError(t *testing.T) {
	leakcheck.Check(t)
	st := etcdMutexes(t)
	name := uniqueName(t)
	ls, _ := st.lockers(t, name, 2)
	g, err := semaphore.NewGroup(t.Context(), ls...)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	var ran atomic.Int32
	started := make(chan struct{})
	g.Go(func(ctx context.Context) error {
		close(started)
		ran.Add(1)
		time.Sleep(100 * time.Millisecond)
		return boom
	})
	<-started
	// This one waits for the permit (limit 1) and must not run.
	g.Go(func(ctx context.Context) error { ran.Add(1); return nil })
	if err := g.Wait(); !errors.Is(err, boom) {
		t.Errorf("Wait: %v, want boom", err)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("%d functions ran, want 1: a function waiting for a permit must not run after the first error", n)
	}
	if cause := context.Cause(g.Context()); !errors.Is(cause, boom) {
		t.Errorf("group context's cause: %v, want boom", cause)
	}
	waitKeys(t, st, name, 0)
}

// TestGroupLoss: a permit lost while its function runs cancels the
// function's context with a cause wrapping holdfast.ErrLost; the function's
// ctx error, or its nil, is reported as an error wrapping the loss.
func TestGroupLoss(t *testing.T) {
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			leakcheck.Check(t)
			testGroupLoss(t, sc.mk(t))
		})
	}
}

func testGroupLoss(t *testing.T, st store) {
	for _, tc := range []struct {
		name    string
		returns func(ctx context.Context) error
		want    []error
	}{
		{"ctx-error", func(ctx context.Context) error { return ctx.Err() }, []error{context.Canceled, holdfast.ErrLost}},
		{"cause", context.Cause, []error{holdfast.ErrLost}},
		{"nil", func(context.Context) error { return nil }, []error{holdfast.ErrLost}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := uniqueName(t)
			l, kill := st.newLocker(t, name)
			g, err := semaphore.NewGroup(t.Context(), l)
			if err != nil {
				t.Fatal(err)
			}
			running := make(chan struct{})
			var cause error
			g.Go(func(ctx context.Context) error {
				close(running)
				select {
				case <-ctx.Done():
					cause = context.Cause(ctx)
				case <-time.After(10 * time.Second):
					return errors.New("context not cancelled 10 s after the permit's session was revoked")
				}
				return tc.returns(ctx)
			})
			<-running
			kill()
			err = g.Wait()
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("Wait: %v, want an error matching %v", err, w)
				}
			}
			if !errors.Is(cause, holdfast.ErrLost) {
				t.Errorf("function's context cause: %v, want holdfast.ErrLost", cause)
			}
		})
	}
}

// TestGroupCancel: cancelling the context given to NewGroup while functions
// wait for a permit held elsewhere ends Wait promptly with
// context.Canceled, runs none of them, and leaves no key; a running
// function sees its context cancelled.
func TestGroupCancel(t *testing.T) {
	leakcheck.Check(t)
	st := etcdMutexes(t)
	name := uniqueName(t)
	other, _ := st.newLocker(t, name)
	og, err := other.Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ls, _ := st.lockers(t, name, 3)
	g, err := semaphore.NewGroup(ctx, ls...)
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	for range 3 {
		g.Go(func(context.Context) error { ran.Add(1); return nil })
	}
	waitKeys(t, st, name, 4)
	cancel()
	t0 := time.Now()
	if err := g.Wait(); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait: %v, want context.Canceled", err)
	}
	if took := time.Since(t0); took > time.Second {
		t.Errorf("Wait took %v after cancel", took)
	}
	if n := ran.Load(); n != 0 {
		t.Errorf("%d functions ran", n)
	}
	waitKeys(t, st, name, 1)
	if err := og.Unlock(t.Context()); err != nil {
		t.Error(err)
	}

	// A running function's context ends with the group's.
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	g, err = semaphore.NewGroup(ctx, ls[0])
	if err != nil {
		t.Fatal(err)
	}
	running := make(chan struct{})
	g.Go(func(ctx context.Context) error {
		close(running)
		<-ctx.Done()
		return ctx.Err()
	})
	<-running
	cancel()
	if err := g.Wait(); !errors.Is(err, context.Canceled) || errors.Is(err, holdfast.ErrLost) {
		t.Errorf("Wait: %v, want context.Canceled, not a loss", err)
	}
	waitKeys(t, st, name, 0)
}

func TestNewGroupBadInput(t *testing.T) {
	var nilLocker holdfast.Locker
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		lockers []holdfast.Locker
	}{
		{"nil-context", nil, []holdfast.Locker{fakeLocker{}}},
		{"no-locker", context.Background(), nil},
		{"nil-locker", context.Background(), []holdfast.Locker{fakeLocker{}, nilLocker}},
	} {
		if g, err := semaphore.NewGroup(tc.ctx, tc.lockers...); !errors.Is(err, holdfast.ErrInvalidArgument) || g != nil {
			t.Errorf("%s: NewGroup: %v, %v; want nil and holdfast.ErrInvalidArgument", tc.name, g, err)
		}
	}
	if p := semaphore.Permit(context.Background()); p != nil {
		t.Errorf("Permit outside a Group: %v", p)
	}
}

type fakeLocker struct{}

func (fakeLocker) Lock(context.Context) (holdfast.Grant, error)    { return nil, holdfast.ErrLocked }
func (fakeLocker) TryLock(context.Context) (holdfast.Grant, error) { return nil, holdfast.ErrLocked }

// TestGroupAfterWait: a Group serves one batch: after Wait, a function
// passed to Go is not called, and the next Wait says why.
func TestGroupAfterWait(t *testing.T) {
	leakcheck.Check(t)
	st := etcdMutexes(t)
	name := uniqueName(t)
	ls, _ := st.lockers(t, name, 1)
	g, err := semaphore.NewGroup(t.Context(), ls...)
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	g.Go(func(context.Context) error { ran.Add(1); return nil })
	if err := g.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	g.Go(func(context.Context) error { ran.Add(1); return nil })
	if err := g.Wait(); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait after a function passed to Go after Wait: %v, want context.Canceled", err)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("%d functions ran, want 1", n)
	}
	waitKeys(t, st, name, 0)
}
