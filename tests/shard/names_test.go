package shard_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/shard"
)

// TestNestedGroupsEtcd and TestNestedGroupsConsul: a group "G/0" whose
// name is the lock of shard 0 of a group "G" cannot run beside it, in
// either order. Started second, "G/0" finds its name held by a lock (the
// shard's), and "G" finds its shard 0's lock covering the keys of a longer
// name: Run returns holdfast.ErrConflict within a second, and the group
// that ran first keeps its shards. (A name with a segment starting with
// "." — "G/.members", say — is refused by New before any request; see
// TestConfigEtcd.)
func TestNestedGroupsEtcd(t *testing.T)   { nestedGroups(t, etcdStore(t, 5*time.Second)) }
func TestNestedGroupsConsul(t *testing.T) { nestedGroups(t, consulStore(t)) }

func nestedGroups[G holdfast.Grant](t *testing.T, st store[G]) {
	work := func(ctx context.Context, _ shard.Shard, _ G) { <-ctx.Done() }
	for _, outerFirst := range []bool{true, false} {
		outer := uniq(t)
		first, second := outer, outer+"/0"
		if !outerFirst {
			first, second = second, first
		}
		s1, _, _ := st.join(t)
		g1, err := shard.New(s1, first, shard.Config{Shards: 2})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g1.Run(ctx, work) }()
		for deadline := time.Now().Add(10 * time.Second); len(g1.Owned()) < 2; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: owns %v after 10 s", first, g1.Owned())
			}
		}
		s2, _, _ := st.join(t)
		g2, _ := shard.New(s2, second, shard.Config{Shards: 2})
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		began := time.Now()
		err = g2.Run(sctx, work)
		scancel()
		if !errors.Is(err, holdfast.ErrConflict) || time.Since(began) > time.Second {
			t.Errorf("%s beside %s: Run returned %v after %v, want ErrConflict within 1 s", second, first, err, time.Since(began).Round(time.Millisecond))
		}
		if got := len(g1.Owned()); got != 2 {
			t.Errorf("%s owns %d shards after %s's attempt, want 2", first, got, second)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: Run: %v", first, err)
		}
	}
}

// TestNativeLockOnShardEtcd and TestNativeLockOnShardConsul: the store's own
// lock command (etcdctl lock, consul lock) on a shard's lock name, "G/0",
// excludes the group's members as on any lock name. Holding it first, it
// keeps shard 0 from the member assigned it: that member works its other
// shard, and waits for shard 0 (Inspect shows the native session as the
// owner, not a member, and the member among the waiters); once the native
// command's child exits (it releases the lock then), the member's work on
// shard 0 starts within 1 s.
func TestNativeLockOnShardEtcd(t *testing.T)   { nativeLockOnShard(t, etcdStore(t, 5*time.Second)) }
func TestNativeLockOnShardConsul(t *testing.T) { nativeLockOnShard(t, consulStore(t)) }

func nativeLockOnShard[G holdfast.Grant](t *testing.T, st store[G]) {
	name := uniq(t)
	dir := t.TempDir()
	held, stop := filepath.Join(dir, "held"), filepath.Join(dir, "stop")
	native := st.native(t, name+"/0", "touch "+held+"; while [ ! -e "+stop+" ]; do sleep 0.02; done")
	if err := native.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = native.Wait(); close(exited) }()
	t.Cleanup(func() { _ = native.Process.Kill(); <-exited })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(held); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the native lock command did not hold within 20 s")
		}
	}

	s, _, _ := st.join(t)
	g, err := shard.New(s, name, shard.Config{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan int, 2)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- g.Run(ctx, func(ctx context.Context, sh shard.Shard, _ G) {
			started <- sh.Index
			<-ctx.Done()
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case i := <-started:
		if i != 1 {
			t.Fatalf("shard %d started while the native command held it", i)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("shard 1 did not start within 10 s")
	}
	time.Sleep(300 * time.Millisecond)
	state, err := s.Inspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if len(state.Members) != 1 || len(state.Shards) != 2 {
		t.Fatalf("Inspect: %+v, want 1 member, 2 shards", state)
	}
	me, s0 := state.Members[0].ID, state.Shards[0]
	if s0.Owner == "" || s0.Owner == me || !slices.Contains(s0.Waiters, me) || state.Members[0].Shards != 1 {
		t.Errorf("Inspect: shard 0 %+v, member %+v: want an owner that is not the member (the native session), the member waiting", s0, state.Members[0])
	}
	select {
	case i := <-started:
		t.Fatalf("shard %d started while the native command held it", i)
	default:
	}
	stopped := time.Now()
	if err := os.WriteFile(stop, nil, 0o644); err != nil { // its child exits, then it releases
		t.Fatal(err)
	}
	select {
	case i := <-started:
		took := time.Since(stopped)
		t.Logf("shard %d started %v after the native command's child was told to exit", i, took.Round(time.Millisecond))
		if i != 0 || took > time.Second {
			t.Errorf("shard %d started %v after the native command was stopped, want shard 0 within 1 s", i, took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("shard 0 did not start within 10 s of the native command's stop")
	}
}
