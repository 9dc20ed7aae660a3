package main

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// TestFrozenEarlyTimeout: the store freezes (a proxy stops passing
// bytes) 0 to 60 ms after "holdfast lock --timeout" starts, while another
// client holds the lock: whether the freeze came while connecting or once
// holdfast was queued, the store is silent at the timeout, and holdfast
// exits 125 saying so, never 124 (the lock held); so does one frozen once
// it said it waits (queued). Beside them, one whose store answers exits
// 124. Before, a freeze after the session was opened gave 124 ("timed
// out waiting"), in some runs only, and, queued, always, 5 s after the
// timeout (its session's close waited for the silent store).
func TestFrozenEarlyTimeout(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	target := strings.TrimPrefix(e.Endpoints()[0], "http://")
	const timeout = 700 * time.Millisecond
	holder := start(t, "lock", "-v", "--endpoints", e.Endpoints()[0], "early", "--", "sleep", "60")
	eventually(t, 10*time.Second, "the holder did not acquire", func() bool { return strings.Contains(holder.stderr.String(), "acquired") })
	var wg sync.WaitGroup
	defer wg.Wait()
	const queued = -2 * time.Nanosecond
	for _, delay := range []time.Duration{queued, -1, 0, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond, 45 * time.Millisecond, 60 * time.Millisecond} {
		wg.Go(func() {
			t.Run(fmt.Sprint(delay), func(t *testing.T) {
				proxy := embedtest.StartProxy(t, target)
				t.Cleanup(proxy.Mend)
				p := start(t, "lock", "-v", "--endpoints", proxy.Addr(), "--timeout", timeout.String(), "early", "--", "true")
				if delay == queued {
					eventually(t, 5*time.Second, "holdfast does not wait", func() bool { return strings.Contains(p.stderr.String(), "waiting behind") })
					proxy.Pause()
				}
				if delay >= 0 {
					time.Sleep(delay)
					proxy.Pause()
				}
				code := p.wait(t, 10*time.Second)
				msg := p.stderr.String()
				t.Logf("frozen at %v: exit %d after %v: %s", delay, code, p.took.Round(time.Millisecond), strings.TrimSpace(msg))
				want, says := exitFailed, "did not answer within"
				if delay == -1 { // never frozen
					want, says = exitNotAcquired, "not acquired"
				}
				if code != want || !strings.Contains(msg, says) {
					t.Errorf("exit %d, want %d saying %q; stderr: %s", code, want, says, msg)
				}
				if p.took > timeout+300*time.Millisecond {
					t.Errorf("took %v, want within --timeout %v + 300 ms", p.took, timeout)
				}
			})
		})
	}
}
