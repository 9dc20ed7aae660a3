package embedtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/embedtest/internal/testserver"
)

// consulClusterReady bounds how long a cluster (or a restarted server) may
// take to elect a leader and accept writes.
const consulClusterReady = 60 * time.Second

// ConsulCluster is a real Consul cluster of server agents (not -dev) on
// loopback ports, each with its own data directory under one temporary
// directory: a server can be killed (as by a crash) and restarted with its
// state, and the cluster elects a new leader meanwhile. Its methods are safe
// for concurrent use.
type ConsulCluster struct {
	dir     string
	bin     string
	servers []*consulServer
	mu      sync.Mutex
	closed  bool
}

type consulServer struct {
	name  string
	ports []int // http, server, serf_lan, serf_wan
	cfg   string
	cmd   *exec.Cmd
	out   *testserver.TailBuffer
	done  chan struct{}
}

// StartConsulCluster starts n (3 or 5) Consul servers that join each other,
// and waits until they have elected a leader, accept a KV write and create
// a session. Close
// stops them and removes their directory.
func StartConsulCluster(n int) (*ConsulCluster, error) {
	if n < 1 {
		return nil, errors.New("embedtest: a Consul cluster needs at least one server")
	}
	bin, err := ConsulBinary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "holdfast-consul-cluster-")
	if err != nil {
		return nil, err
	}
	c := &ConsulCluster{dir: dir, bin: bin}
	for i := range n {
		ports, err := testserver.FreePorts(4, true)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.servers = append(c.servers, &consulServer{name: fmt.Sprintf("holdfast-server-%d-%s", i, testserver.RandomHex(4)), ports: ports})
	}
	for i, s := range c.servers {
		var join []string
		for j, o := range c.servers {
			if j != i {
				join = append(join, fmt.Sprintf("127.0.0.1:%d", o.ports[2]))
			}
		}
		cfg := map[string]any{
			"node_name":        s.name,
			"server":           true,
			"bootstrap_expect": n,
			"retry_join":       join,
			"retry_interval":   "1s",
			"data_dir":         filepath.Join(dir, s.name),
			"bind_addr":        "127.0.0.1",
			"client_addr":      "127.0.0.1",
			"advertise_addr":   "127.0.0.1",
			"ports": map[string]int{
				"http": s.ports[0], "server": s.ports[1], "serf_lan": s.ports[2], "serf_wan": s.ports[3],
				"dns": -1, "grpc": -1, "grpc_tls": -1, "https": -1,
			},
			"performance":             map[string]any{"raft_multiplier": 1},
			"log_level":               "warn",
			"disable_update_check":    true,
			"leave_on_terminate":      false,
			"skip_leave_on_interrupt": true,
			"limits":                  map[string]any{"http_max_conns_per_client": 4096},
		}
		data, _ := json.MarshalIndent(cfg, "", "  ")
		s.cfg = filepath.Join(dir, s.name+".json")
		if err := os.WriteFile(s.cfg, data, 0o600); err != nil {
			c.Close()
			return nil, err
		}
	}
	for i := range c.servers {
		if err := c.start(i); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.waitReady(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// ConsulServers starts a cluster of n servers for t and closes it when t
// ends.
func ConsulServers(t testing.TB, n int) *ConsulCluster {
	t.Helper()
	c, err := StartConsulCluster(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func (c *ConsulCluster) start(i int) error {
	s := c.servers[i]
	s.out = &testserver.TailBuffer{Max: consulOutputTail}
	s.done = make(chan struct{})
	s.cmd = exec.Command(c.bin, "agent", "-config-file="+s.cfg)
	s.cmd.Dir = c.dir
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = procAttr()
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("embedtest: start consul server %d: %w", i, err)
	}
	done := s.done
	cmd := s.cmd
	go func() { _ = cmd.Wait(); close(done) }()
	return nil
}

// Size returns the number of servers.
func (c *ConsulCluster) Size() int { return len(c.servers) }

// HTTPAddr returns server i's HTTP address, "127.0.0.1:port".
func (c *ConsulCluster) HTTPAddr(i int) string {
	return fmt.Sprintf("127.0.0.1:%d", c.servers[i].ports[0])
}

// NewClient returns an API client of server i.
func (c *ConsulCluster) NewClient(i int) (*api.Client, error) {
	cfg := api.DefaultConfig()
	cfg.Address = c.HTTPAddr(i)
	cfg.Token = ""
	return api.NewClient(cfg)
}

// running reports whether server i's process runs.
func (c *ConsulCluster) running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.servers[i]
	if s.done == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Leader returns the index of the running server that leads, as a running
// server reports it, or an error if none does now.
func (c *ConsulCluster) Leader() (int, error) {
	hc := &http.Client{Timeout: 2 * time.Second}
	for i := range c.servers {
		if !c.running(i) {
			continue
		}
		resp, err := hc.Get("http://" + c.HTTPAddr(i) + "/v1/status/leader")
		if err != nil {
			continue
		}
		var addr string
		err = json.NewDecoder(resp.Body).Decode(&addr)
		resp.Body.Close()
		if err != nil || addr == "" {
			continue
		}
		_, port, _ := net.SplitHostPort(addr)
		for j, s := range c.servers {
			if strconv.Itoa(s.ports[1]) == port && c.running(j) {
				return j, nil // (a server killed a moment ago may still be reported)
			}
		}
	}
	return -1, errors.New("embedtest: no Consul leader now")
}

// WaitLeader polls Leader until a leader is known, for at most timeout.
func (c *ConsulCluster) WaitLeader(timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		l, err := c.Leader()
		if err == nil {
			return l, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("%w within %v", err, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitReady waits until a leader is elected and every running server
// accepts a KV write and creates a session.
func (c *ConsulCluster) waitReady() error {
	deadline := time.Now().Add(consulClusterReady)
	if _, err := c.WaitLeader(consulClusterReady); err != nil {
		return fmt.Errorf("%w\n%s", err, c.output())
	}
	for i := range c.servers {
		if !c.running(i) {
			continue
		}
		cli, err := c.NewClient(i)
		if err != nil {
			return err
		}
		for {
			_, err := cli.KV().Put(&api.KVPair{Key: "embedtest/ready", Value: []byte(strconv.Itoa(i))}, nil)
			if err == nil {
				// A session too: refused until the server's node is
				// registered, a moment after it has a leader.
				var id string
				if id, _, err = cli.Session().Create(&api.SessionEntry{Name: "embedtest-ready", TTL: "10s", Checks: []string{}}, nil); err == nil {
					_, err = cli.Session().Destroy(id, nil)
				}
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("embedtest: consul server %d does not accept writes: %v\n%s", i, err, c.output())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// Kill kills server i at once (SIGKILL, as a crash): it does not leave the
// cluster, and Restart brings it back with its state.
func (c *ConsulCluster) Kill(i int) error {
	c.mu.Lock()
	s := c.servers[i]
	c.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("embedtest: consul server %d is not running", i)
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	_ = s.cmd.Process.Kill()
	<-s.done
	return nil
}

// Freeze stops server i's process (SIGSTOP): it neither sends nor receives
// anything until Thaw, while its sockets stay open, as a server cut off in
// both directions (or a frozen VM) would. Past the election timeout the
// others elect a leader among themselves; a frozen leader resumes as a
// stale leader and steps down when it hears of the newer term.
func (c *ConsulCluster) Freeze(i int) error { return c.signal(i, syscall.SIGSTOP) }

// Thaw resumes server i after Freeze (SIGCONT).
func (c *ConsulCluster) Thaw(i int) error { return c.signal(i, syscall.SIGCONT) }

func (c *ConsulCluster) signal(i int, sig syscall.Signal) error {
	if !c.running(i) {
		return fmt.Errorf("embedtest: consul server %d is not running", i)
	}
	c.mu.Lock()
	p := c.servers[i].cmd.Process
	c.mu.Unlock()
	if err := p.Signal(sig); err != nil {
		return fmt.Errorf("embedtest: consul server %d: %v: %w", i, sig, err)
	}
	return nil
}

// Restart starts server i again (after Kill) with its data, and waits until
// the cluster has a leader and the server accepts writes.
func (c *ConsulCluster) Restart(i int) error {
	if c.running(i) {
		return fmt.Errorf("embedtest: consul server %d is running", i)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errors.New("embedtest: cluster closed")
	}
	err := c.start(i)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.waitReady()
}

func (c *ConsulCluster) output() string {
	var b strings.Builder
	for i, s := range c.servers {
		if s.out != nil {
			fmt.Fprintf(&b, "--- consul server %d:\n%s\n", i, testserver.Tail(s.out.String(), 2000))
		}
	}
	return b.String()
}

// Close kills every server and removes the cluster's directory.
func (c *ConsulCluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	for i, s := range c.servers {
		if c.running(i) {
			_ = c.Kill(i)
		}
		testserver.ReleasePorts(s.ports)
	}
	os.RemoveAll(c.dir)
}
