package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/internal/testserver"
)

const (
	// etcdReadyTimeout bounds the wait for a member (or a whole new
	// cluster) to elect a leader and serve clients.
	etcdReadyTimeout = 30 * time.Second
	// etcdStartAttempts bounds the retries when a chosen port was taken by
	// another process between our probe and etcd's bind.
	etcdStartAttempts = 5
	// etcdRestartBindWait bounds how long Restart retries binding its old ports.
	etcdRestartBindWait = 5 * time.Second
	// etcdDialTimeout is the DialTimeout of the clients made by NewClient.
	etcdDialTimeout = 5 * time.Second
	// etcdSnapshotCount keeps snapshots small and frequent.
	etcdSnapshotCount = 10000
	// etcdMaxMembers bounds the cluster size StartEtcd accepts.
	etcdMaxMembers = 16
	// etcdBcryptCost is golang.org/x/crypto/bcrypt.MinCost.
	etcdBcryptCost = 4
)

// Cluster is an in-process etcd cluster of one or more members listening on
// loopback ports. Its methods are safe for concurrent use.
type Cluster struct {
	dir     string
	tempDir bool // dir was created by StartEtcd and is removed by Close
	token   string
	members []*member
	opts    etcdOptions
	rootPW  string // the root user's password, WithEtcdAuth

	mu     sync.Mutex // guards member.etcd, member.cut, closed
	closed bool

	closeOnce sync.Once

	conns connTracker // connections of the clients made by NewClient
}

type member struct {
	name      string
	dir       string
	clientURL url.URL
	peerURL   url.URL
	id        types.ID

	op   sync.Mutex // serialises Stop/Restart/Close of this member
	etcd *embed.Etcd
	cut  bool
}

// EtcdOption configures StartEtcd, Etcd and EtcdCluster.
type EtcdOption func(*etcdOptions)

type etcdOptions struct {
	pki         *embedtest.PKI
	requireCert bool
	auth        bool
}

// WithEtcdTLS serves the client URLs over TLS ("https://127.0.0.1:port")
// with p's server certificate; with requireClientCert, clients must present
// a certificate signed by p's CA (mutual TLS). Peer traffic stays plain.
// The clients made by NewClient and Client trust p's CA and present p's
// client certificate.
func WithEtcdTLS(p *embedtest.PKI, requireClientCert bool) EtcdOption {
	return func(o *etcdOptions) { o.pki, o.requireCert = p, requireClientCert }
}

// WithEtcdAuth enables etcd's authentication once the cluster is up: a
// user "root" with the role "root" and a random password
// (RootCredentials). The clients made by NewClient and Client log in as
// root; AddUser creates users confined to key prefixes.
func WithEtcdAuth() EtcdOption { return func(o *etcdOptions) { o.auth = true } }

// StartEtcd starts an etcd cluster of the given number of members (1 or 3 are
// typical; 1 to 16 are accepted) with data under dir/member-<i>, and waits (at most
// 30 s) until every member serves and a leader is elected. If dir is empty a
// temporary directory is used and removed by Close; otherwise dir is created
// if needed, must not already hold member data, and is left in place by Close.
// opts may secure it (WithEtcdTLS, WithEtcdAuth). The caller must call Close.
func StartEtcd(dir string, members int, opts ...EtcdOption) (*Cluster, error) {
	if members < 1 || members > etcdMaxMembers {
		return nil, fmt.Errorf("etcdtest: etcd cluster needs 1 to %d members, got %d", etcdMaxMembers, members)
	}
	c := &Cluster{dir: dir, token: "holdfast-" + testserver.RandomHex(8)}
	for _, o := range opts {
		if o != nil {
			o(&c.opts)
		}
	}
	if c.opts.requireCert && c.opts.pki == nil {
		return nil, errors.New("etcdtest: client certificates need WithEtcdTLS")
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "holdfast-etcd-")
		if err != nil {
			return nil, fmt.Errorf("etcdtest: etcd data dir: %w", err)
		}
		c.dir, c.tempDir = d, true
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("etcdtest: etcd data dir: %w", err)
	}
	for i := range members {
		c.members = append(c.members, &member{
			name: fmt.Sprintf("m%d", i),
			dir:  filepath.Join(c.dir, fmt.Sprintf("member-%d", i)),
		})
	}
	for _, m := range c.members {
		if _, err := os.Stat(m.dir); err == nil {
			c.removeTemp()
			return nil, fmt.Errorf("etcdtest: etcd data dir %s already exists; use a fresh dir", m.dir)
		}
	}
	var err error
	for range etcdStartAttempts {
		if err = c.start(); err == nil || !testserver.IsAddrInUse(err) {
			break
		}
	}
	if err != nil {
		c.removeTemp()
		return nil, err
	}
	if err := c.waitReady(c.members, time.Now().Add(etcdReadyTimeout)); err != nil {
		c.Close()
		return nil, err
	}
	if c.opts.auth {
		if err := c.enableAuth(); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// enableAuth creates the root user and enables authentication.
func (c *Cluster) enableAuth() error {
	cli, err := c.NewClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), etcdReadyTimeout)
	defer cancel()
	c.rootPW = "root-" + testserver.RandomHex(8)
	for _, step := range []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "root", c.rootPW); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			return fmt.Errorf("etcdtest: enable etcd auth: %w", err)
		}
	}
	return nil
}

// RootCredentials returns the root user's name and password of a cluster
// started WithEtcdAuth, else "", "".
func (c *Cluster) RootCredentials() (user, password string) {
	if c.rootPW == "" {
		return "", ""
	}
	return "root", c.rootPW
}

// PKI returns the PKI of a cluster started WithEtcdTLS, else nil.
func (c *Cluster) PKI() *embedtest.PKI { return c.opts.pki }

// AddUser creates user with password and a role (named after the user) that
// grants read-write access to the keys under each of prefixes and nothing
// else; with no prefixes the user can do nothing with keys. It needs a
// cluster started WithEtcdAuth.
func (c *Cluster) AddUser(user, password string, prefixes ...string) error {
	cli, err := c.NewClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	role := user + "-role"
	if _, err := cli.RoleAdd(ctx, role); err != nil {
		return fmt.Errorf("etcdtest: add role %s: %w", role, err)
	}
	for _, p := range prefixes {
		if _, err := cli.RoleGrantPermission(ctx, role, p, clientv3.GetPrefixRangeEnd(p), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			return fmt.Errorf("etcdtest: grant %s to %s: %w", p, role, err)
		}
	}
	if _, err := cli.UserAdd(ctx, user, password); err != nil {
		return fmt.Errorf("etcdtest: add user %s: %w", user, err)
	}
	if _, err := cli.UserGrantRole(ctx, user, role); err != nil {
		return fmt.Errorf("etcdtest: grant role %s to %s: %w", role, user, err)
	}
	return nil
}

// start makes one attempt at choosing ports and starting every member. On
// failure everything this attempt started or wrote is undone.
func (c *Cluster) start() error {
	ports, err := testserver.FreePorts(2*len(c.members), false)
	if err != nil {
		return err
	}
	var initial []string
	scheme := "http"
	if c.opts.pki != nil {
		scheme = "https"
	}
	for i, m := range c.members {
		m.clientURL = url.URL{Scheme: scheme, Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i])}
		m.peerURL = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])}
		initial = append(initial, m.name+"="+m.peerURL.String())
	}
	cluster := strings.Join(initial, ",")
	for i, m := range c.members {
		e, err := embed.StartEtcd(c.config(m, cluster))
		if err == nil {
			m.etcd = e
			m.id = e.Server.MemberID()
			continue
		}
		for _, s := range c.members[:i] {
			s.etcd.Server.HardStop()
			s.etcd.Close()
			s.etcd = nil
		}
		for _, s := range c.members {
			os.RemoveAll(s.dir)
		}
		testserver.ReleasePorts(ports)
		return fmt.Errorf("etcdtest: start etcd member %d: %w", i, err)
	}
	return nil
}

// config is the embed configuration of member m. initialCluster is only
// used when m's data dir is empty (first start).
func (c *Cluster) config(m *member, initialCluster string) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.InitialCluster = initialCluster
	cfg.InitialClusterToken = c.token
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.SnapshotCount = etcdSnapshotCount
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(quietLogger())
	cfg.LogLevel = "error"
	// bcrypt's lowest cost (golang.org/x/crypto/bcrypt.MinCost) for the
	// passwords of users (WithEtcdAuth, AddUser, or a test's own UserAdd):
	// at the default cost 10 one hash or login takes 0.2 s, and 5 s under
	// -race on a loaded 2-core machine (measured), longer than a test's
	// bound on a Dial.
	cfg.BcryptCost = etcdBcryptCost
	if p := c.opts.pki; p != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: p.CertFile, KeyFile: p.KeyFile}
		if c.opts.requireCert {
			cfg.ClientTLSInfo.TrustedCAFile = p.CAFile
			cfg.ClientTLSInfo.ClientCertAuth = true
		}
	}
	return cfg
}

// waitReady waits until each of ms is ready to serve clients (which implies
// a leader is known) or deadline passes.
func (c *Cluster) waitReady(ms []*member, deadline time.Time) error {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for _, m := range ms {
		c.mu.Lock()
		e := m.etcd
		c.mu.Unlock()
		if e == nil {
			return fmt.Errorf("etcdtest: etcd member %s stopped while starting", m.name)
		}
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			return fmt.Errorf("etcdtest: etcd member %s failed while starting: %v", m.name, err)
		case <-e.Server.StopNotify():
			return fmt.Errorf("etcdtest: etcd member %s stopped while starting", m.name)
		case <-timer.C:
			return fmt.Errorf("etcdtest: etcd member %s not ready within %v", m.name, etcdReadyTimeout)
		}
	}
	return nil
}

// Etcd starts a 1-member etcd cluster in t.TempDir() and closes it with
// t.Cleanup. It calls t.Fatal if the cluster cannot start.
func Etcd(t testing.TB, opts ...EtcdOption) *Cluster {
	t.Helper()
	return EtcdCluster(t, 1, opts...)
}

// EtcdCluster starts an n-member etcd cluster in t.TempDir() and closes it
// with t.Cleanup. It calls t.Fatal if the cluster cannot start.
func EtcdCluster(t testing.TB, n int, opts ...EtcdOption) *Cluster {
	t.Helper()
	c, err := StartEtcd(t.TempDir(), n, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Endpoints returns the client URLs ("http://127.0.0.1:port", https with
// WithEtcdTLS) of the members
// that are running now, in member order.
func (c *Cluster) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var eps []string
	for _, m := range c.members {
		if m.etcd != nil {
			eps = append(eps, m.clientURL.String())
		}
	}
	return eps
}

// Endpoint returns the client URL of member i, running or stopped, or "" if
// i is out of range.
func (c *Cluster) Endpoint(i int) string {
	if i < 0 || i >= len(c.members) {
		return ""
	}
	return c.members[i].clientURL.String()
}

// Size returns the number of members, running or stopped.
func (c *Cluster) Size() int { return len(c.members) }

// NewClient returns a new client on the endpoints of all members (stopped
// ones included, so the client uses them again once they are restarted),
// with a 5 s DialTimeout and an error-level logger; on a cluster started
// WithEtcdTLS it trusts the CA and presents the PKI's client certificate,
// and on one started WithEtcdAuth it logs in as root. opts may change the
// config. The caller must Close the client.
func (c *Cluster) NewClient(opts ...func(*clientv3.Config)) (*clientv3.Client, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, errors.New("etcdtest: etcd cluster is closed")
	}
	cfg := clientv3.Config{
		DialTimeout: etcdDialTimeout,
		Logger:      quietLogger(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(c.conns.dial)},
	}
	if p := c.opts.pki; p != nil {
		tlsCfg, err := p.ClientTLS(true)
		if err != nil {
			return nil, err
		}
		cfg.TLS = tlsCfg
	}
	cfg.Username, cfg.Password = c.RootCredentials()
	for _, m := range c.members {
		cfg.Endpoints = append(cfg.Endpoints, m.clientURL.String())
	}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: etcd client: %w", err)
	}
	return cli, nil
}

// Client is NewClient for tests: the client is closed with t.Cleanup, and an
// error calls t.Fatal.
func (c *Cluster) Client(t testing.TB, opts ...func(*clientv3.Config)) *clientv3.Client {
	t.Helper()
	cli, err := c.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func (c *Cluster) member(i int) (*member, error) {
	if i < 0 || i >= len(c.members) {
		return nil, fmt.Errorf("etcdtest: no etcd member %d (cluster has %d)", i, len(c.members))
	}
	return c.members[i], nil
}

// Stop stops member i and keeps its data; a leader first tries to hand
// leadership over. Stopping a stopped member is a no-op.
//
// The clients made by NewClient and Client lose their connections to member
// i at once, as in a crash, and move to other members; etcd's graceful
// shutdown would otherwise wait up to its request timeout (about 7 s) for
// their open streams (watches, keep-alives) to end. Other clients' open
// streams still delay Stop that way.
func (c *Cluster) Stop(i int) error {
	m, err := c.member(i)
	if err != nil {
		return err
	}
	c.stop(m, false)
	return nil
}

// stop stops m; hard skips the leadership hand-over.
func (c *Cluster) stop(m *member, hard bool) {
	m.op.Lock()
	defer m.op.Unlock()
	c.mu.Lock()
	e := m.etcd
	m.etcd = nil
	c.mu.Unlock()
	if e == nil {
		return
	}
	c.conns.block(m.clientURL.Host)
	if hard {
		e.Server.HardStop()
	}
	e.Close()
}

// Restart starts the stopped member i again on the same ports and data dir
// and waits (at most 30 s) until it serves clients, which needs a quorum of
// reachable members. If member i is cut (CutPeer), Restart returns as soon as
// the member is started, without waiting, since it cannot become ready; its
// peer traffic is cut again right after start. Restarting a running member
// is an error.
func (c *Cluster) Restart(i int) error {
	m, err := c.member(i)
	if err != nil {
		return err
	}
	m.op.Lock()
	defer m.op.Unlock()
	c.mu.Lock()
	closed, running := c.closed, m.etcd != nil
	c.mu.Unlock()
	if closed {
		return errors.New("etcdtest: etcd cluster is closed")
	}
	if running {
		return fmt.Errorf("etcdtest: etcd member %d is running", i)
	}
	var e *embed.Etcd
	bindDeadline := time.Now().Add(etcdRestartBindWait)
	for {
		// The data dir holds the membership, so no initial cluster is needed;
		// a name=peerURL entry keeps the config valid.
		e, err = embed.StartEtcd(c.config(m, m.name+"="+m.peerURL.String()))
		if err == nil || !testserver.IsAddrInUse(err) || time.Now().After(bindDeadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("etcdtest: restart etcd member %d: %w", i, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		e.Close()
		return errors.New("etcdtest: etcd cluster is closed")
	}
	m.etcd = e
	c.applyCuts()
	cut := m.cut
	c.mu.Unlock()
	c.conns.unblock(m.clientURL.Host)
	if cut {
		return nil
	}
	return c.waitReady([]*member{m}, time.Now().Add(etcdReadyTimeout))
}

// CutPeer drops all peer (raft) traffic between member i and every other
// member, in both directions, until MendPeer(i). Client traffic is not
// affected. The cut survives Stop and Restart of any member. An out-of-range
// i is ignored.
func (c *Cluster) CutPeer(i int) { c.setCut(i, true) }

// MendPeer restores the peer traffic that CutPeer(i) dropped (traffic to a
// member that is itself cut stays dropped). An out-of-range i is ignored.
func (c *Cluster) MendPeer(i int) { c.setCut(i, false) }

func (c *Cluster) setCut(i int, cut bool) {
	if i < 0 || i >= len(c.members) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.members[i].cut = cut
	c.applyCuts()
}

// applyCuts makes every running member's transport match the cut flags: the
// link a-b is cut iff a or b is cut. c.mu must be held.
func (c *Cluster) applyCuts() {
	for _, a := range c.members {
		if a.etcd == nil {
			continue
		}
		for _, b := range c.members {
			if a == b {
				continue
			}
			if a.cut || b.cut {
				a.etcd.Server.CutPeer(b.id)
			} else {
				a.etcd.Server.MendPeer(b.id)
			}
		}
	}
}

// Leader returns the index of the current leader, or -1 if there is none. The
// leader is the running member that believes it leads, with the highest raft
// term (a cut-off old leader may still believe it leads, in an older term,
// until it notices it lost its quorum).
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	leader, term := -1, uint64(0)
	for i, m := range c.members {
		if m.etcd == nil {
			continue
		}
		s := m.etcd.Server
		if s.Leader() != s.MemberID() {
			continue
		}
		if t := s.Term(); leader < 0 || t > term {
			leader, term = i, t
		}
	}
	return leader
}

// WaitLeader polls Leader until it is not -1 and returns it, or returns an
// error after timeout.
func (c *Cluster) WaitLeader(timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		if l := c.Leader(); l >= 0 {
			return l, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("etcdtest: no etcd leader within %v", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close stops every member at once (without leadership hand-overs), cuts the
// connections of the clients made by NewClient and Client (they then fail
// fast), and, if StartEtcd created the data dir itself, removes it. Close is
// idempotent.
func (c *Cluster) Close() { c.closeOnce.Do(c.close) }

func (c *Cluster) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	var wg sync.WaitGroup
	var ports []int
	for _, m := range c.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.stop(m, true)
		}()
		for _, u := range []url.URL{m.clientURL, m.peerURL} {
			var p int
			if _, err := fmt.Sscanf(u.Port(), "%d", &p); err == nil {
				ports = append(ports, p)
			}
		}
	}
	wg.Wait()
	testserver.ReleasePorts(ports)
	c.removeTemp()
}

func (c *Cluster) removeTemp() {
	if c.tempDir {
		os.RemoveAll(c.dir)
	}
}

var (
	quietOnce sync.Once
	quietLog  *zap.Logger
)

// quietLogger is the shared error-level logger of servers and clients.
func quietLogger() *zap.Logger {
	quietOnce.Do(func() {
		enc := zap.NewProductionEncoderConfig()
		enc.EncodeTime = zapcore.ISO8601TimeEncoder
		quietLog = zap.New(quietCore{zapcore.NewCore(
			zapcore.NewConsoleEncoder(enc),
			zapcore.Lock(os.Stderr),
			zap.ErrorLevel,
		)})
	})
	return quietLog
}

// quietCore drops the errors every embedded etcd logs when it is closed
// normally ("use of closed network connection", "server closed").
type quietCore struct{ zapcore.Core }

func (q quietCore) With(fs []zapcore.Field) zapcore.Core { return quietCore{q.Core.With(fs)} }

func (q quietCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if q.Enabled(e.Level) {
		return ce.AddCore(e, q)
	}
	return ce
}

func (q quietCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	for _, f := range fs {
		if err, ok := f.Interface.(error); ok && f.Type == zapcore.ErrorType && isClosedErr(err) {
			return nil
		}
	}
	return q.Core.Write(e, fs)
}

func isClosedErr(err error) bool {
	s := err.Error()
	return errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) ||
		strings.Contains(s, "use of closed network connection") || strings.Contains(s, "server closed")
}

// connTracker dials and tracks the connections of the clients made by
// NewClient, so that Stop can cut them and refuse new ones while a member is
// down.
type connTracker struct {
	mu      sync.Mutex
	blocked map[string]bool
	conns   map[*trackedConn]bool
}

type trackedConn struct {
	net.Conn
	addr string
	t    *connTracker
	once sync.Once
}

func (tc *trackedConn) Close() error {
	tc.once.Do(func() {
		tc.t.mu.Lock()
		delete(tc.t.conns, tc)
		tc.t.mu.Unlock()
	})
	return tc.Conn.Close()
}

func (t *connTracker) dial(ctx context.Context, addr string) (net.Conn, error) {
	t.mu.Lock()
	blocked := t.blocked[addr]
	t.mu.Unlock()
	if blocked {
		return nil, fmt.Errorf("etcdtest: etcd member %s is stopped", addr)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: conn, addr: addr, t: t}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.blocked[addr] { // blocked while dialing
		conn.Close()
		return nil, fmt.Errorf("etcdtest: etcd member %s is stopped", addr)
	}
	if t.conns == nil {
		t.conns = map[*trackedConn]bool{}
	}
	t.conns[tc] = true
	return tc, nil
}

// block refuses new connections to addr and closes the open ones.
func (t *connTracker) block(addr string) {
	t.mu.Lock()
	if t.blocked == nil {
		t.blocked = map[string]bool{}
	}
	t.blocked[addr] = true
	var open []*trackedConn
	for tc := range t.conns {
		if tc.addr == addr {
			open = append(open, tc)
		}
	}
	t.mu.Unlock()
	for _, tc := range open {
		tc.Close()
	}
}

func (t *connTracker) unblock(addr string) {
	t.mu.Lock()
	delete(t.blocked, addr)
	t.mu.Unlock()
}
