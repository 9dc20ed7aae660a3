package embedtest

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-cleanhttp"

	"github.com/holdfast/holdfast/embedtest/internal/testserver"
)

const (
	// consulReadyTimeout bounds the wait for a started agent to elect itself
	// leader, accept a KV write and create a session.
	consulReadyTimeout = 30 * time.Second
	// consulStartAttempts bounds the retries when a chosen port was taken by
	// another process between our probe and the agent's bind.
	consulStartAttempts = 3
	// consulStopTimeout is how long Close waits after SIGTERM before SIGKILL.
	consulStopTimeout = 5 * time.Second
	// consulOutputTail is how much of the agent's output is kept for errors.
	consulOutputTail = 64 << 10
	// consulReadyKey is written (then deleted) to check that KV writes work.
	consulReadyKey = "holdfast-embedtest/ready"
)

var (
	consulBinMu sync.Mutex
	consulBin   string // cached result of a successful ConsulBinary
)

// ConsulBinary returns the path of a Consul binary: $CONSUL_BIN if set (it
// must be an executable file), else the path printed by the repository's
// scripts/consul.sh, which builds Consul once and caches it in
// ~/.cache/holdfast (the first build takes minutes; concurrent calls wait for
// one build). The repository root is found by walking up to go.mod from this
// source file's directory, then from the working directory.
func ConsulBinary() (string, error) {
	if env := os.Getenv("CONSUL_BIN"); env != "" {
		if err := testserver.CheckExecutable(env); err != nil {
			return "", fmt.Errorf("embedtest: CONSUL_BIN: %w", err)
		}
		return env, nil
	}
	consulBinMu.Lock()
	defer consulBinMu.Unlock()
	if consulBin != "" {
		return consulBin, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "scripts", "consul.sh")
	cmd := exec.Command("bash", script)
	cmd.Dir = root
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("embedtest: %s failed: %w\n%s", script, err, testserver.Tail(stderr.String(), 4096))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	bin := strings.TrimSpace(lines[len(lines)-1])
	if bin == "" {
		return "", fmt.Errorf("embedtest: %s printed no path\n%s", script, testserver.Tail(stderr.String(), 4096))
	}
	if err := testserver.CheckExecutable(bin); err != nil {
		return "", fmt.Errorf("embedtest: %s: %w", script, err)
	}
	consulBin = bin
	return bin, nil
}

// repoRoot finds the directory holding go.mod and scripts/consul.sh, from
// this source file's location, then from the working directory.
func repoRoot() (string, error) {
	var starts []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, dir := range starts {
		for {
			if fileExists(filepath.Join(dir, "go.mod")) && fileExists(filepath.Join(dir, "scripts", "consul.sh")) {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("embedtest: no Consul binary: CONSUL_BIN is not set and no repository root (go.mod with scripts/consul.sh) was found above the source file or the working directory %v", starts)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// ConsulOption configures StartConsul and Consul.
type ConsulOption func(*consulOptions)

type consulOptions struct {
	acl         bool
	pki         *PKI
	requireCert bool
}

// WithACL starts the agent with ACLs enabled, default policy "deny", and a
// known management token (ConsulAgent.MgmtToken), so that requests without a
// token are denied (HTTP 403).
func WithACL() ConsulOption {
	return func(o *consulOptions) { o.acl = true }
}

// WithHTTPS serves the HTTP API over HTTPS only, with p's server
// certificate (for 127.0.0.1); the plain HTTP port is closed. With
// requireClientCert, clients must present a certificate signed by p's CA
// (mutual TLS). HTTPAddr is then the HTTPS address, Scheme "https", and the
// clients made by NewClient and Client trust p's CA and present p's client
// certificate.
func WithHTTPS(p *PKI, requireClientCert bool) ConsulOption {
	return func(o *consulOptions) { o.pki, o.requireCert = p, requireClientCert }
}

// ConsulAgent is a running `consul agent -dev` process: a single server
// that is its own leader, listening on loopback ports only. Its methods are
// safe for concurrent use.
type ConsulAgent struct {
	// HTTPAddr is the address of the HTTP API, "127.0.0.1:port".
	HTTPAddr string
	// Scheme is the HTTP API's: "http", or "https" WithHTTPS.
	Scheme string
	// CAFile is the CA certificate that vouches for the agent's
	// certificate WithHTTPS, else "".
	CAFile string
	// MgmtToken is the management token when the agent runs WithACL, else "".
	MgmtToken string
	// NodeName is the agent's (unique) node name.
	NodeName string

	dir    string
	ports  []int
	cmd    *exec.Cmd
	out    *testserver.TailBuffer
	exited chan struct{} // closed when the process has exited
	err    error         // the process's exit error, set before exited is closed

	pki *PKI // WithHTTPS

	mu         sync.Mutex
	transports []*http.Transport
	closeOnce  sync.Once
}

// StartConsul starts `consul agent -dev` with a generated configuration in a
// new temporary directory and waits (at most 30 s) until it has a leader,
// accepts a KV write and creates a session (which it refuses for a moment
// after it elects itself, until its node is registered). The caller must call Close.
func StartConsul(opts ...ConsulOption) (*ConsulAgent, error) {
	var o consulOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	bin, err := ConsulBinary()
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		a, err := startConsul(bin, o)
		if err == nil || !testserver.IsAddrInUse(err) || attempt >= consulStartAttempts {
			return a, err
		}
	}
}

func startConsul(bin string, o consulOptions) (*ConsulAgent, error) {
	ports, err := testserver.FreePorts(4, true) // http, server, serf_lan, serf_wan
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "holdfast-consul-")
	if err != nil {
		testserver.ReleasePorts(ports)
		return nil, fmt.Errorf("embedtest: consul dir: %w", err)
	}
	a := &ConsulAgent{
		HTTPAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]),
		Scheme:   "http",
		NodeName: "holdfast-" + testserver.RandomHex(6),
		dir:      dir,
		ports:    ports,
		out:      &testserver.TailBuffer{Max: consulOutputTail},
		exited:   make(chan struct{}),
	}
	if o.acl {
		a.MgmtToken = randomUUID()
	}
	cfg := map[string]any{
		"node_name":      a.NodeName,
		"data_dir":       filepath.Join(dir, "data"),
		"bind_addr":      "127.0.0.1",
		"client_addr":    "127.0.0.1",
		"advertise_addr": "127.0.0.1",
		"ports": map[string]int{
			"http": ports[0], "server": ports[1], "serf_lan": ports[2], "serf_wan": ports[3],
			"dns": -1, "grpc": -1, "grpc_tls": -1, "https": -1,
		},
		"log_level":            "warn",
		"disable_update_check": true,
		// Every test client and benchmark contender connects from
		// 127.0.0.1; Consul's default of 200 connections per client IP
		// answers 429 to a 32-contender benchmark.
		"limits": map[string]any{"http_max_conns_per_client": 4096},
	}
	if p := o.pki; p != nil {
		a.Scheme, a.CAFile, a.pki = "https", p.CAFile, p
		pts := cfg["ports"].(map[string]int)
		pts["http"], pts["https"] = -1, ports[0]
		cfg["tls"] = map[string]any{
			"defaults": map[string]any{
				"ca_file":         p.CAFile,
				"cert_file":       p.CertFile,
				"key_file":        p.KeyFile,
				"verify_incoming": false,
				"verify_outgoing": false,
			},
			"https": map[string]any{"verify_incoming": o.requireCert},
		}
	}
	if o.acl {
		cfg["acl"] = map[string]any{
			"enabled":                  true,
			"default_policy":           "deny",
			"enable_token_persistence": false,
			"tokens": map[string]string{
				"initial_management": a.MgmtToken,
				"agent":              a.MgmtToken,
			},
		}
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil { // cannot happen: plain maps
		a.cleanup()
		return nil, fmt.Errorf("embedtest: consul config: %w", err)
	}
	cfgFile := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(cfgFile, data, 0o600); err != nil {
		a.cleanup()
		return nil, fmt.Errorf("embedtest: consul config: %w", err)
	}

	a.cmd = exec.Command(bin, "agent", "-dev", "-config-file="+cfgFile)
	a.cmd.Dir = dir
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	a.cmd.SysProcAttr = procAttr()
	if err := a.cmd.Start(); err != nil {
		a.cleanup()
		return nil, fmt.Errorf("embedtest: start %s: %w", bin, err)
	}
	go func() {
		a.err = a.cmd.Wait()
		close(a.exited)
	}()
	if err := a.waitReady(); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// waitReady waits until the agent we started (checked by node name, in case
// another process answers on the port) reports a leader, accepts a KV
// write and creates a session.
func (a *ConsulAgent) waitReady() error {
	tr := cleanhttp.DefaultTransport()
	if a.pki != nil {
		cfg, err := a.pki.ClientTLS(true)
		if err != nil {
			return err
		}
		tr.TLSClientConfig = cfg
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	deadline := time.Now().Add(consulReadyTimeout)
	var last error
	for {
		select {
		case <-a.exited:
			err := fmt.Errorf("embedtest: consul agent exited while starting: %v\n%s", a.err, a.out.String())
			if strings.Contains(a.out.String(), "address already in use") {
				err = fmt.Errorf("%w (%w)", err, syscall.EADDRINUSE)
			}
			return err
		default:
		}
		if last = a.probe(hc); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("embedtest: consul agent not ready within %v: %v\n%s", consulReadyTimeout, last, a.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (a *ConsulAgent) probe(hc *http.Client) error {
	var self struct{ Config struct{ NodeName string } }
	if err := a.request(hc, "GET", "/v1/agent/self", nil, &self); err != nil {
		return err
	}
	if self.Config.NodeName != a.NodeName {
		return fmt.Errorf("%s is served by another agent (node %q)", a.HTTPAddr, self.Config.NodeName)
	}
	var leader string
	if err := a.request(hc, "GET", "/v1/status/leader", nil, &leader); err != nil {
		return err
	}
	if leader == "" {
		return errors.New("no leader yet")
	}
	var ok bool
	if err := a.request(hc, "PUT", "/v1/kv/"+consulReadyKey, strings.NewReader("ok"), &ok); err != nil {
		return err
	}
	if !ok {
		return errors.New("KV write returned false")
	}
	if err := a.request(hc, "DELETE", "/v1/kv/"+consulReadyKey, nil, nil); err != nil {
		return err
	}
	// A session: refused ("Missing node registration") until the agent
	// has registered its node, a moment after it elects itself.
	var session struct{ ID string }
	if err := a.request(hc, "PUT", "/v1/session/create", strings.NewReader(`{"Name":"embedtest-ready","TTL":"10s","LockDelay":"0s"}`), &session); err != nil {
		return err
	}
	return a.request(hc, "PUT", "/v1/session/destroy/"+session.ID, nil, nil)
}

// request does one HTTP API call with the management token (if any) and
// decodes a 200 response's JSON body into out (if not nil).
func (a *ConsulAgent) request(hc *http.Client, method, path string, body io.Reader, out any) error {
	req, err := http.NewRequest(method, a.Scheme+"://"+a.HTTPAddr+path, body)
	if err != nil {
		return err
	}
	if a.MgmtToken != "" {
		req.Header.Set("X-Consul-Token", a.MgmtToken)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// Consul starts an agent with StartConsul and stops it with t.Cleanup. It
// calls t.Fatal (never t.Skip) if the binary is missing or the agent fails.
func Consul(t testing.TB, opts ...ConsulOption) *ConsulAgent {
	t.Helper()
	a, err := StartConsul(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// NewClient returns an API client of the agent: api.Config{Address:
// a.HTTPAddr, Scheme: a.Scheme} with a.MgmtToken as Token (when the agent
// runs WithACL), the PKI's CA and client certificate as TLSConfig
// (WithHTTPS) and its own connection pool; mod may change the config. With an
// empty Token api.NewClient uses $CONSUL_HTTP_TOKEN. The pool's idle
// connections are closed by Close.
func (a *ConsulAgent) NewClient(mod ...func(*api.Config)) (*api.Client, error) {
	cli, _, err := a.newClient(mod...)
	return cli, err
}

func (a *ConsulAgent) newClient(mod ...func(*api.Config)) (*api.Client, *http.Transport, error) {
	tr := cleanhttp.DefaultPooledTransport()
	cfg := &api.Config{
		Address:   a.HTTPAddr,
		Scheme:    a.Scheme,
		Token:     a.MgmtToken,
		Transport: tr,
	}
	if p := a.pki; p != nil {
		cfg.TLSConfig = api.TLSConfig{CAFile: p.CAFile, CertFile: p.ClientCertFile, KeyFile: p.ClientKeyFile}
	}
	for _, m := range mod {
		if m != nil {
			m(cfg)
		}
	}
	cli, err := api.NewClient(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("embedtest: consul client: %w", err)
	}
	a.mu.Lock()
	a.transports = append(a.transports, tr)
	a.mu.Unlock()
	return cli, tr, nil
}

// Client is NewClient for tests: the client's idle connections are closed
// with t.Cleanup, and an error calls t.Fatal.
func (a *ConsulAgent) Client(t testing.TB) *api.Client {
	t.Helper()
	cli, tr, err := a.newClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return cli
}

// Output returns the tail (up to 64 KiB) of the agent's stdout and stderr.
func (a *ConsulAgent) Output() string { return a.out.String() }

// Restart kills the agent (SIGKILL) and starts it again with the same
// configuration and ports. A -dev agent keeps its state in memory, so the
// new one starts empty: every session and key is gone, as after a crash of
// a dev agent or the loss of a single-server cluster's data. It waits until
// the new agent is ready. Do not call it concurrently with Close.
func (a *ConsulAgent) Restart() error {
	if a.cmd == nil || a.cmd.Process == nil {
		return errors.New("embedtest: consul agent not started")
	}
	_ = a.cmd.Process.Kill()
	<-a.exited
	cmd := exec.Command(a.cmd.Args[0], a.cmd.Args[1:]...)
	cmd.Dir, cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = a.cmd.Dir, a.out, a.out, procAttr()
	exited := make(chan struct{})
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("embedtest: restart consul: %w", err)
	}
	a.cmd, a.exited = cmd, exited
	go func() {
		a.err = cmd.Wait()
		close(exited)
	}()
	return a.waitReady()
}

// Close stops the agent (SIGTERM, then SIGKILL after 5 s), waits for it to
// exit, closes the idle connections of the clients made by NewClient and
// Client, and removes its directory. Close is idempotent.
func (a *ConsulAgent) Close() {
	a.closeOnce.Do(func() {
		if a.cmd != nil && a.cmd.Process != nil {
			select {
			case <-a.exited:
			default:
				a.cmd.Process.Signal(syscall.SIGTERM)
				t := time.NewTimer(consulStopTimeout)
				select {
				case <-a.exited:
				case <-t.C:
					a.cmd.Process.Kill()
					<-a.exited
				}
				t.Stop()
			}
		}
		a.mu.Lock()
		for _, tr := range a.transports {
			tr.CloseIdleConnections()
		}
		a.mu.Unlock()
		a.cleanup()
	})
}

func (a *ConsulAgent) cleanup() {
	os.RemoveAll(a.dir)
	testserver.ReleasePorts(a.ports)
}

// randomUUID returns a random (version 4) UUID, the format Consul requires
// for ACL token secrets.
func randomUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
