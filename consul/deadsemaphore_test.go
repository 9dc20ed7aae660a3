package consul

import (
	"bufio"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
)

// TestDeadSemaphoreLockKey (issue 25's Consul items, 2): `consul lock -n 2
// NAME cmd` (api.Semaphore's layout) is killed with SIGKILL, and its session
// ends (destroyed here, as Consul does once its TTL expires or its node's
// check fails): NAME/.lock stays with a semaphore's flags, naming a dead
// holder. While the holder's session lives, Lock and TryLock refuse the name
// with ErrConflict, and the error says how to recover; once it is dead, a
// Lock takes the name (deleting the dead semaphore's lock key at its index,
// as api.Semaphore.Destroy would), and nothing is left after Unlock. Before,
// Lock refused the name for ever (ErrConflict: flags of a semaphore).
func TestDeadSemaphoreLockKey(t *testing.T) {
	t.Parallel()
	a := agent(t)
	bin, err := embedtest.ConsulBinary()
	if err != nil {
		t.Fatal(err)
	}
	admin := a.Client(t)
	name := uniqueName(t)
	cmd := exec.Command(bin, "lock", "-n", "2", "-shell", "-http-addr="+a.HTTPAddr, name, "echo held; sleep 30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its child too
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	kill := func() {
		if !killed {
			killed = true
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
	}
	defer kill()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "held" {
		t.Fatalf("consul lock -n 2 child: %q, %v", line, err)
	}
	kill()
	lock := lockKeyNow(t, admin, name)
	if lock == nil || lock.Flags != api.SemaphoreFlagValue {
		t.Fatalf("NAME/.lock after the kill: %+v, want a semaphore's", lock)
	}
	var holder string
	pairs, _, err := admin.KV().List(name+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pairs {
		if p.Key != LockKey(name) && p.Session != "" {
			holder = p.Session
		}
	}
	if holder == "" {
		t.Fatalf("no contender key of the killed consul lock under the name: %q", keys(t, admin, name))
	}

	m := newMutex(t, newSession(t, a.Client(t), WithLockDelay(0)), name)
	for _, try := range []bool{true, false} {
		var err error
		if try {
			_, err = m.TryLock(timeout(t, 5*time.Second))
		} else {
			_, err = m.Lock(timeout(t, 5*time.Second))
		}
		if !errors.Is(err, holdfast.ErrConflict) || !strings.Contains(err.Error(), "consul kv delete") {
			t.Fatalf("try=%v while the semaphore's holder lives: %v, want ErrConflict saying how to recover", try, err)
		}
	}
	destroy(t, admin, holder)
	for _, try := range []bool{true, false} {
		// The dead semaphore's lock key as the kill left it (again for the
		// second round).
		if _, err := admin.KV().Put(&api.KVPair{Key: LockKey(name), Flags: api.SemaphoreFlagValue, Value: lock.Value}, nil); err != nil {
			t.Fatal(err)
		}
		var g *Grant
		var err error
		if try {
			g, err = m.TryLock(timeout(t, 5*time.Second))
		} else {
			g, err = m.Lock(timeout(t, 5*time.Second))
		}
		if err != nil {
			t.Fatalf("try=%v once the semaphore's holder is dead: %v", try, err)
		}
		if err := g.Unlock(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, cleanupBound, "nothing left under the name", func() bool { return len(keys(t, admin, name)) == 0 })
	}
}
