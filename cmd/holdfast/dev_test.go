package main

import (
	"bufio"
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
// directory is gone after it stops.
func TestDev(t *testing.T) {
	ports, err := embedtest.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(holdfastBin(t), "dev", "--port", strconv.Itoa(ports[0]), "--peer-port", strconv.Itoa(ports[1]))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
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
		t.Fatal("holdfast dev printed nothing within 60 s")
	}
	m := regexp.MustCompile(`serving on http://127\.0\.0\.1:(\d+) \(data in (\S+)\)`).FindStringSubmatch(first)
	if m == nil || m[1] != strconv.Itoa(ports[0]) {
		t.Fatalf("first line %q: want the endpoint on port %d", first, ports[0])
	}
	dir := m[2]
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
