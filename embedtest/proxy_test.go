package embedtest_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest"
)

// echoServer answers each line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends a line and waits up to d for its echo.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string, d time.Duration) (string, error) {
	t.Helper()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(d))
	got, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func TestProxyModes(t *testing.T) {
	p := embedtest.StartProxy(t, echoServer(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, err := roundTrip(t, c, r, "a", 5*time.Second); err != nil || got != "a" {
		t.Fatalf("flowing: got %q, %v; want a", got, err)
	}

	p.Pause()
	if got, err := roundTrip(t, c, r, "b", 200*time.Millisecond); err == nil {
		t.Fatalf("paused: got %q, want a timeout", got)
	}
	p.Mend()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "b\n" {
		t.Fatalf("after Mend: got %q, %v; want the held b", got, err)
	}

	p.Blackhole()
	if got, err := roundTrip(t, c, r, "c", 200*time.Millisecond); err == nil {
		t.Fatalf("blackholed: got %q, want a timeout", got)
	}
	p.Mend()
	if got, err := roundTrip(t, c, r, "d", 5*time.Second); err != nil || got != "d" {
		t.Fatalf("after a blackhole: got %q, %v; want d (c dropped)", got, err)
	}

	// A new connection while paused is accepted, and silent.
	p.Pause()
	c2, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
	if err != nil {
		t.Fatalf("dial while paused: %v", err)
	}
	defer c2.Close()
	r2 := bufio.NewReader(c2)
	if got, err := roundTrip(t, c2, r2, "e", 200*time.Millisecond); err == nil {
		t.Fatalf("new connection while paused: got %q, want a timeout", got)
	}
	p.Mend()
	p.Close()
	p.Close() // idempotent
}
