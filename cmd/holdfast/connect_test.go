package main

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// silentListener accepts connections and never answers; it returns its
// address.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// refusedAddr is an address where nothing listens.
func refusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestConnectBounded: --try and --timeout bound the whole attempt,
// connecting included, on both stores, against a listener that never
// answers and a refused port; the failure names the endpoint and the last
// transport error.
func TestConnectBounded(t *testing.T) {
	silent, refused := silentListener(t), refusedAddr(t)
	for _, tc := range []struct {
		name  string
		args  []string
		bound time.Duration
		addr  string
		why   string
	}{
		{"etcd/silent/try", []string{"--endpoints", silent, "--try"}, tryBound, silent, "did not answer within"},
		{"etcd/silent/timeout", []string{"--endpoints", silent, "--timeout", "1s"}, time.Second, silent, "did not answer within"},
		{"etcd/silent/try-timeout", []string{"--endpoints", silent, "--try", "--timeout", "500ms"}, 500 * time.Millisecond, silent, "did not answer within 500ms"},
		{"etcd/refused/try", []string{"--endpoints", refused, "--try"}, tryBound, refused, "refused"},
		{"etcd/refused/timeout", []string{"--endpoints", refused, "--timeout", "1s"}, time.Second, refused, "refused"},
		{"consul/silent/try", []string{"--backend", "consul", "--addr", silent, "--try"}, tryBound, silent, "did not answer within"},
		{"consul/silent/timeout", []string{"--backend", "consul", "--addr", silent, "--timeout", "1s"}, time.Second, silent, "did not answer within"},
		{"consul/refused/try", []string{"--backend", "consul", "--addr", refused, "--try"}, tryBound, refused, "refused"},
		{"consul/refused/timeout", []string{"--backend", "consul", "--addr", refused, "--timeout", "1s"}, time.Second, refused, "refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, append(append([]string{"lock"}, tc.args...), "conn", "--", "true")...)
			code := p.wait(t, 30*time.Second)
			msg := p.stderr.String()
			t.Logf("exit %d after %v: %s", code, p.took.Round(time.Millisecond), strings.TrimSpace(msg))
			if code != exitFailed {
				t.Errorf("exit %d, want %d", code, exitFailed)
			}
			if p.took > tc.bound+100*time.Millisecond {
				t.Errorf("took %v, want within %v + 100 ms", p.took, tc.bound)
			}
			if !strings.Contains(msg, tc.addr) || !strings.Contains(msg, tc.why) {
				t.Errorf("message does not name %s and say %q", tc.addr, tc.why)
			}
		})
	}
}
