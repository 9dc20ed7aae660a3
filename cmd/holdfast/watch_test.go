package main

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// TestWatchNoticesSilentStore: status --watch and elect --observe, the
// store frozen (a proxy stops passing bytes) after their first read: they
// exit 125 saying the store did not answer, within twice --timeout (and a
// little), on both stores. Before, they waited for ever on a watch (etcd)
// or a 5-minute blocking query (Consul).
func TestWatchNoticesSilentStore(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	a := embedtest.Consul(t)
	const timeout = 500 * time.Millisecond
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, st := range []struct {
		name, target string
		flags        func(addr string) []string
	}{
		{"etcd", strings.TrimPrefix(e.Endpoints()[0], "http://"), func(addr string) []string { return []string{"--endpoints", addr} }},
		{"consul", a.HTTPAddr, func(addr string) []string { return []string{"--backend", "consul", "--addr", addr} }},
	} {
		for _, cmd := range [][]string{{"status", "--watch"}, {"elect", "--observe"}} {
			wg.Go(func() {
				t.Run(st.name+"/"+cmd[0], func(t *testing.T) {
					proxy := embedtest.StartProxy(t, st.target)
					t.Cleanup(proxy.Mend)
					p := start(t, append(append(cmd, st.flags(proxy.Addr())...), "--timeout", timeout.String(), "watched/"+st.name)...)
					eventually(t, 10*time.Second, "nothing printed", func() bool { return p.stdout.String() != "" })
					time.Sleep(100 * time.Millisecond) // waiting for a change now
					proxy.Pause()
					frozen := time.Now()
					code := p.wait(t, 10*time.Second)
					took := time.Since(frozen)
					t.Logf("frozen at 0: exit %d at %v; stderr: %q", code, took.Round(time.Millisecond), p.stderr.String())
					if code != exitFailed || !strings.Contains(p.stderr.String(), "did not answer within") {
						t.Errorf("exit %d, want %d saying the store did not answer; stderr: %s", code, exitFailed, p.stderr.String())
					}
					if bound := 2*timeout + timeout/16 + 400*time.Millisecond; took > bound {
						t.Errorf("exited %v after the freeze, want within %v", took, bound)
					}
				})
			})
		}
	}
}
