package consul

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/embedtest"
)

// appendLine appends line to the file at path (O_APPEND: atomic for small
// writes, across processes).
func appendLine(t testing.TB, path, line string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		t.Error(err)
	}
}

// maxRunning reads the journal at path ("+" when a holder starts, "-" when
// it ends) and returns the most holders at once, and how many started.
func maxRunning(t testing.TB, path string) (peak, starts int) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Fields(string(b)) {
		switch l {
		case "+":
			n++
			starts++
			peak = max(peak, n)
		case "-":
			n--
		}
	}
	return peak, starts
}

// watchHolders polls the semaphore's lock key until ctx ends and returns the
// most holders it listed at once (after pruning none: what Consul stores).
func watchHolders(ctx context.Context, t testing.TB, c *api.Client, name string) <-chan int {
	out := make(chan int, 1)
	go func() {
		peak := 0
		for ctx.Err() == nil {
			pair, _, err := c.KV().Get(name+"/.lock", nil)
			if err == nil && pair != nil {
				if st, err := decodeSemaphoreLock(pair.Value, 0); err == nil {
					peak = max(peak, len(st.holders))
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		out <- peak
	}()
	return out
}

// TestSemaphoreInteropCLI: `consul lock -n 2 PREFIX cmd` processes (the real
// CLI of the built Consul binary) and holdfast Semaphores on one prefix never
// hold more than 2 permits together: every holder journals its start and
// end in one file while it holds, and the lock key never lists more than 2.
func TestSemaphoreInteropCLI(t *testing.T) {
	t.Parallel()
	bin, err := embedtest.ConsulBinary()
	if err != nil {
		t.Skip(err)
	}
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	journal := t.TempDir() + "/journal"
	ctx := timeout(t, 90*time.Second)
	wctx, stop := context.WithCancel(ctx)
	peakCh := watchHolders(wctx, t, c, name)
	var wg sync.WaitGroup
	const cliRuns, hfRuns = 3, 6
	for i := range 3 { // CLI processes, one after another per goroutine
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range cliRuns {
				cmd := exec.CommandContext(ctx, bin, "lock", "-http-addr="+a.HTTPAddr, "-n", "2", "-name", fmt.Sprintf("cli-%d", i), name,
					fmt.Sprintf("echo + >> %s; sleep 0.15; echo - >> %s", journal, journal))
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("consul lock: %v\n%s", err, out)
					return
				}
			}
		}()
	}
	for range 2 { // holdfast
		m := newSemaphore(t, newSession(t, c), name, 2)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range hfRuns {
				g, err := m.Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				appendLine(t, journal, "+")
				time.Sleep(100 * time.Millisecond)
				appendLine(t, journal, "-")
				if err := g.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	stop()
	peak, starts := maxRunning(t, journal)
	stored := <-peakCh
	t.Logf("%d holds, at most %d at once; the lock key listed at most %d holders", starts, peak, stored)
	if peak > 2 || stored > 2 {
		t.Fatalf("more than 2 holders at once: journal %d, lock key %d", peak, stored)
	}
	if starts != 3*cliRuns+2*hfRuns {
		t.Fatalf("%d holds, want %d", starts, 3*cliRuns+2*hfRuns)
	}
}

// TestSemaphoreInteropAPI: api.Semaphore and holdfast Semaphores on one
// prefix never hold more than 2 permits together, and all make progress.
func TestSemaphoreInteropAPI(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c := a.Client(t)
	name := uniqueName(t)
	ctx := timeout(t, 60*time.Second)
	wctx, stop := context.WithCancel(ctx)
	peakCh := watchHolders(wctx, t, c, name)
	h := &holders{limit: 2}
	var wg sync.WaitGroup
	const runs = 8
	for range 3 {
		sem, err := c.SemaphoreOpts(&api.SemaphoreOptions{Prefix: name, Limit: 2, SessionTTL: "10s"})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range runs {
				lost, err := sem.Acquire(ctx.Done())
				if err != nil || lost == nil {
					t.Errorf("api.Semaphore Acquire: %v", err)
					return
				}
				h.in()
				time.Sleep(20 * time.Millisecond)
				h.out()
				if err := sem.Release(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range 3 {
		m := newSemaphore(t, newSession(t, c), name, 2)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range runs {
				g, err := m.Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				h.in()
				time.Sleep(20 * time.Millisecond)
				h.out()
				if err := g.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	stop()
	stored := <-peakCh
	t.Logf("peak %d holders at once, the lock key listed at most %d", h.peak.Load(), stored)
	if h.viol.Load() != 0 || stored > 2 {
		t.Fatalf("more than 2 holders at once: %d moments, lock key %d", h.viol.Load(), stored)
	}
}
