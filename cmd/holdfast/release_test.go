package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// TestReleaseStopsLeftovers: CMD exits leaving two processes in the
// background, one that ends on SIGTERM and one that ignores it: both are
// gone before the lock is released (SIGTERM, then SIGKILL after
// --kill-grace), and holdfast exits with CMD's status. Before, both ran
// on, without the lock, after holdfast had released it and exited.
func TestReleaseStopsLeftovers(t *testing.T) {
	t.Parallel()
	e := etcdtest.Etcd(t)
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	const grace = 500 * time.Millisecond
	p := start(t, "lock", "--endpoints", e.Endpoints()[0], "--kill-grace", grace.String(), "leftovers", "--", "sh", "-c",
		`sleep 30 & echo $! >> "$1"; (trap "" TERM; exec sleep 30) & echo $! >> "$1"; exit 3`, "sh", pids)
	code := p.wait(t, 10*time.Second)
	b, err := os.ReadFile(pids)
	if err != nil {
		t.Fatal(err)
	}
	var left []int
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		if running(pid) {
			left = append(left, pid)
		}
	}
	t.Logf("exit %d after %v; stderr: %q", code, p.took.Round(time.Millisecond), p.stderr.String())
	if code != 3 {
		t.Errorf("exit %d, want CMD's 3", code)
	}
	if len(left) > 0 {
		t.Errorf("CMD's background processes %v still run after holdfast released the lock and exited", left)
	}
	if !strings.Contains(p.stderr.String(), "leaving processes in its process group") {
		t.Errorf("holdfast did not say it stopped what CMD left; stderr: %s", p.stderr.String())
	}
	if keys := keysUnder(t, e.Client(t), "leftovers/"); len(keys) != 0 {
		t.Errorf("keys %v left, want the lock released", keys)
	}
}

// cutAfter is a TCP proxy to target that, once armed, passes on the first
// bytes from the client that contain marker and then closes both sides of
// that connection without passing the store's answer on: the request
// applies, its answer is lost. Other connections, and later ones, flow.
type cutAfter struct {
	target string
	mu     sync.Mutex
	marker []byte
	cut    chan struct{}
}

func startCutAfter(t *testing.T, target string) (addr string, c *cutAfter) {
	t.Helper()
	c = &cutAfter{target: target}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go c.serve(t, conn)
		}
	}()
	return ln.Addr().String(), c
}

// arm cuts the next connection whose client sends marker; the returned
// channel is closed once it is cut.
func (c *cutAfter) arm(marker string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.marker, c.cut = []byte(marker), make(chan struct{})
	return c.cut
}

func (c *cutAfter) serve(t *testing.T, conn net.Conn) {
	up, err := net.Dial("tcp", c.target)
	if err != nil {
		_ = conn.Close()
		return
	}
	t.Cleanup(func() { _ = conn.Close(); _ = up.Close() })
	var answers sync.Mutex // held while a cut is under way: no answer passes
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := up.Read(buf)
			if err != nil {
				_ = conn.Close()
				return
			}
			answers.Lock()
			_, err = conn.Write(buf[:n])
			answers.Unlock()
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			_ = up.Close()
			return
		}
		c.mu.Lock()
		cut := c.marker != nil && bytes.Contains(buf[:n], c.marker)
		var done chan struct{}
		if cut {
			c.marker, done = nil, c.cut
		}
		c.mu.Unlock()
		if cut {
			answers.Lock()
		}
		if _, err := up.Write(buf[:n]); err != nil {
			return
		}
		if cut {
			time.Sleep(200 * time.Millisecond) // the store applies it
			_ = conn.Close()
			_ = up.Close()
			answers.Unlock()
			close(done)
			return
		}
	}
}

// TestReleaseAnswerLost: the release transaction (etcd: the guarded delete
// of our key) applies, handing the lock to a queued waiter, but its answer
// is lost (the connection cut): the library retries it, finds the key gone,
// and Unlock says ErrNotHeld. holdfast exits 0 and the waiter gets the
// lock; the warning does not blame an outsider alone, since our own release
// may have applied. Before, it said only "... was removed or taken over
// from outside before Unlock".
func TestReleaseAnswerLost(t *testing.T) {
	holdfastBin(t)
	e := etcdtest.Etcd(t)
	addr, c := startCutAfter(t, strings.TrimPrefix(e.Endpoints()[0], "http://"))
	dir := t.TempDir()
	ready, release := filepath.Join(dir, "ready"), filepath.Join(dir, "release")
	// --ttl 60s: no lease renewal (every 20 s) comes between the arming and
	// the release.
	holder := start(t, "lock", "--endpoints", addr, "--ttl", "60s", "rl/x", "--", "sh", "-c", `touch "$0"; while [ ! -e "$1" ]; do sleep 0.05; done`, ready, release)
	eventually(t, 20*time.Second, "the holder did not start", func() bool { _, err := os.Stat(ready); return err == nil })
	waiter := start(t, "lock", "-v", "--endpoints", e.Endpoints()[0], "rl/x", "--", "echo", "got")
	eventually(t, 20*time.Second, "the waiter did not queue", func() bool { return strings.Contains(waiter.stderr.String(), "waiting behind 1") })
	cut := c.arm("rl/x/") // the release's delete names our key
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code := holder.wait(t, 20*time.Second)
	msg := holder.stderr.String()
	t.Logf("holder: exit %d after %v; stderr: %q", code, holder.took.Round(time.Millisecond), msg)
	select {
	case <-cut:
	default:
		t.Fatal("the release's answer was not cut: the test did not do what it means to")
	}
	if code != 0 {
		t.Errorf("holder: exit %d, want 0", code)
	}
	if wc := waiter.wait(t, 20*time.Second); wc != 0 || strings.TrimSpace(waiter.stdout.String()) != "got" {
		t.Errorf("waiter: exit %d, stdout %q, want the lock got; stderr %q", wc, waiter.stdout.String(), waiter.stderr.String())
	}
	if !strings.Contains(msg, "our release may have applied with its answer lost") {
		t.Errorf("holder's stderr %q: want the release's warning to say our own release may have applied", msg)
	}
}
