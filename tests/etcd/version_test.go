package etcd_test

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// dialLogged dials endpoint with a logger and returns what it logged once
// the session is closed (the version check runs in the session's
// background and is over by then).
func dialLogged(t *testing.T, endpoint string) string {
	t.Helper()
	var buf lockedBuffer
	s, err := etcd.Dial(context.Background(), []string{endpoint}, etcd.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the version check's answer
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// TestDialWarnsEarlyRevoke: Dial with a logger warns against Debian's etcd
// 3.4.23, which revokes leases early after a paused leader resumes
// (etcd #15247), and not against the embedded 3.7.
func TestDialWarnsEarlyRevoke(t *testing.T) {
	const warning = "etcd server revokes leases early"
	if log := dialLogged(t, startEtcd34(t)); !strings.Contains(log, warning) || !strings.Contains(log, "version=3.4.23") {
		t.Errorf("etcd 3.4.23: no warning logged:\n%s", log)
	}
	if log := dialLogged(t, etcdtest.Etcd(t).Endpoint(0)); strings.Contains(log, warning) {
		t.Errorf("embedded etcd 3.7: warned:\n%s", log)
	}
}

// startEtcd34 starts Debian's etcd (3.4) on 127.0.0.1, one member, and
// stops it (by PID) when the test ends. It returns the client endpoint.
func startEtcd34(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatalf("etcd (3.4, Debian's package) not found: %v", err)
	}
	ports, err := embedtest.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	var out lockedBuffer
	cmd := exec.Command(bin, "--name", "m0", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "m0="+peer)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Status(ctx, client)
		cancel()
		if err == nil {
			return client
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd at %s not ready after 20 s: %v\n%s", client, err, out.String())
		}
	}
}
