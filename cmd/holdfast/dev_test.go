package main

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest"
)

// TestDev: holdfast dev serves etcd on the given loopback port until
// interrupted, holdfast lock works against it, and the temporary data
// directory is gone after it stops. Without --peer-port the peer port is
// the client port + 1, or a free port if that one is taken, and the first
// line says which (holdfast dev --port 2479 used to fail on 2380).
func TestDev(t *testing.T) {
	ports, err := embedtest.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	if ln, err := net.Listen("tcp", "127.0.0.1:2380"); err == nil {
		defer ln.Close() // the old default peer port, taken as by another etcd
	}
	// A free port whose next one is taken (held by this test).
	var takenPort int
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		next, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		ln.Close()
		if err == nil {
			defer next.Close()
			takenPort = p + 1
			break
		}
	}
	if takenPort == 0 {
		t.Fatal("found no free port followed by one this test could take")
	}
	for _, tc := range []struct {
		name     string
		args     []string
		port     int
		peerPort func(int) bool
	}{
		{"both ports given", []string{"--port", strconv.Itoa(ports[0]), "--peer-port", strconv.Itoa(ports[1])}, ports[0],
			func(p int) bool { return p == ports[1] }},
		{"peer port derived", []string{"--port", strconv.Itoa(ports[2])}, ports[2],
			func(p int) bool { return p == ports[2]+1 }},
		{"peer port taken: a free one", []string{"--port", strconv.Itoa(takenPort - 1)}, takenPort - 1,
			func(p int) bool { return p != takenPort && p != takenPort-1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testDev(t, tc.args, tc.port, tc.peerPort)
		})
	}
}

func testDev(t *testing.T, args []string, port int, peerOK func(int) bool) {
	cmd := exec.Command(holdfastBin(t), append([]string{"dev"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		done <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var first string
	select {
	case first = <-lines:
	case <-time.After(60 * time.Second):
		t.Fatalf("holdfast dev printed nothing within 60 s; stderr: %s", stderr.String())
	}
	m := regexp.MustCompile(`serving on http://127\.0\.0\.1:(\d+) \(peer port (\d+); data in (\S+)\)`).FindStringSubmatch(first)
	if m == nil || m[1] != strconv.Itoa(port) {
		t.Fatalf("first line %q: want the endpoint on port %d and the peer port; stderr: %s", first, port, stderr.String())
	}
	if peer, _ := strconv.Atoi(m[2]); !peerOK(peer) {
		t.Errorf("peer port %d, not the expected one", peer)
	}
	dir := m[3]
	p := start(t, "lock", "--endpoints", "127.0.0.1:"+m[1], "dev/check", "--", "sh", "-c", `echo "$HOLDFAST_TOKEN"`)
	if code := p.wait(t, 30*time.Second); code != 0 || strings.TrimSpace(p.stdout.String()) == "" {
		t.Fatalf("holdfast lock against holdfast dev: exit %d, stdout %q, stderr %s", code, p.stdout.String(), p.stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for range lines {
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("holdfast dev exited with %v after SIGINT, want 0", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("holdfast dev did not stop within 20 s of SIGINT")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("data directory %s left behind (%v)", dir, err)
	}
}

func TestVersion(t *testing.T) {
	out, err := exec.Command(holdfastBin(t), "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "holdfast ") || !strings.Contains(string(out), "go1.") {
		t.Fatalf("holdfast version: %q, %v", out, err)
	}
}
