package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// securityEnv are the variables that configure TLS and credentials; the
// tests' processes start without any of them.
var securityEnv = []string{
	"HOLDFAST_BACKEND", "HOLDFAST_ENDPOINTS", "ETCDCTL_ENDPOINTS", "CONSUL_HTTP_ADDR",
	"ETCDCTL_CACERT", "ETCDCTL_CERT", "ETCDCTL_KEY", "ETCDCTL_USER", "ETCDCTL_PASSWORD",
	"CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_CACERT", "CONSUL_CAPATH",
	"CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY", "CONSUL_HTTP_SSL", "CONSUL_HTTP_SSL_VERIFY",
}

// outputs collects every output of a test's runs, to be searched for secrets.
type outputs struct {
	t    *testing.T
	runs []cliRun
}

type cliRun struct {
	args []string
	out  string // stdout and stderr
}

// run runs holdfast with env (besides a clean environment) and args, and
// returns its exit status and its stdout and stderr.
func (o *outputs) run(env []string, args ...string) (code int, stdout, stderr string) {
	o.t.Helper()
	cmd := exec.Command(holdfastBin(o.t), args...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !contains(securityEnv, name) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out, errOut syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		o.t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		code = 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			o.t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		o.t.Fatalf("holdfast %v still runs after 60 s; stderr: %s", args, errOut.String())
	}
	stdout, stderr = out.String(), errOut.String()
	o.runs = append(o.runs, cliRun{args, stdout + stderr})
	return code, stdout, stderr
}

// refused checks a run that must fail with exit wantCode (125 for lock and
// status) and one line on stderr saying want.
func (o *outputs) refused(what string, wantCode int, want string, env []string, args ...string) {
	o.t.Helper()
	start := time.Now()
	code, stdout, stderr := o.run(env, args...)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if code != wantCode || len(lines) != 1 || !strings.Contains(stderr, want) {
		o.t.Errorf("%s: exit %d, want %d with one line saying %q; stdout %q, stderr:\n%s", what, code, wantCode, want, stdout, stderr)
		return
	}
	o.t.Logf("%s (exit %d, %v): %s", what, code, time.Since(start).Round(time.Millisecond), strings.TrimSpace(stderr))
}

// noSecrets fails the test if any output holds one of secrets, or a line of
// the PEM files given (key material), or a panic.
func (o *outputs) noSecrets(secrets []string, pemFiles ...string) {
	o.t.Helper()
	for _, f := range pemFiles {
		data, err := os.ReadFile(f)
		if err != nil {
			o.t.Fatal(err)
		}
		for _, l := range strings.Split(string(data), "\n") {
			if len(l) >= 16 && !strings.HasPrefix(l, "-----") {
				secrets = append(secrets, l)
			}
		}
	}
	for _, r := range o.runs {
		for _, s := range secrets {
			if s != "" && strings.Contains(r.out, s) {
				o.t.Errorf("holdfast %s: output shows a secret (%.6s...):\n%s", r.args[0], s, r.out)
			}
		}
		if strings.Contains(r.out, "panic:") || strings.Contains(r.out, "goroutine ") {
			o.t.Errorf("holdfast %s: output shows a panic:\n%s", r.args[0], r.out)
		}
	}
	o.t.Logf("%d outputs searched for %d secrets", len(o.runs), len(secrets))
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestSecuredEtcd: holdfast lock, elect and status against etcd with mutual TLS
// and authentication (a user whose role grants jobs/ only): they work with
// the right certificates and credentials, as flags or as etcdctl's
// variables; a wrong password, a user without the prefix, an unknown CA and
// a missing client certificate each exit 125 with one clear line; bad
// combinations are usage errors (2); nothing is written; no output, help
// included, holds a password or key material.
func TestSecuredEtcd(t *testing.T) {
	pki := embedtest.TestPKI(t)
	other := embedtest.TestPKI(t)
	c := etcdtest.Etcd(t, etcdtest.WithEtcdTLS(pki, true), etcdtest.WithEtcdAuth())
	root := c.Client(t)
	const pw, strangerPW, wrongPW = "Locker-pw-5f3a", "Stranger-pw-9c1d", "Wrong-pw-77e2"
	if err := c.AddUser("locker", pw, "jobs/"); err != nil {
		t.Fatal(err)
	}
	if err := c.AddUser("stranger", strangerPW, "other/"); err != nil {
		t.Fatal(err)
	}
	_, rootPW := c.RootCredentials()
	ep := c.Endpoints()[0]
	o := &outputs{t: t}
	tlsFlags := []string{"--endpoints", ep, "--cacert", pki.CAFile, "--cert", pki.ClientCertFile, "--key", pki.ClientKeyFile}
	flags := func(extra ...string) []string {
		return append(append([]string{"lock"}, tlsFlags...), extra...)
	}

	// Refusals: nothing of theirs may be found afterwards.
	o.refused("wrong password", exitFailed, "permission denied", nil, flags("--user", "locker:"+wrongPW, "jobs/nightly", "--", "true")...)
	o.refused("wrong password in $ETCDCTL_PASSWORD", exitFailed, "permission denied", []string{"ETCDCTL_USER=locker", "ETCDCTL_PASSWORD=" + wrongPW}, flags("jobs/nightly", "--", "true")...)
	o.refused("user without the prefix", exitFailed, "permission denied", nil, flags("--user", "stranger", "--password", strangerPW, "jobs/nightly", "--", "true")...)
	o.refused("no user", exitFailed, "permission denied", nil, flags("jobs/nightly", "--", "true")...)
	o.refused("unknown CA", exitFailed, "unknown authority", nil, "lock", "--endpoints", ep, "--cacert", other.CAFile, "--cert", pki.ClientCertFile, "--key", pki.ClientKeyFile, "--user", "locker:"+pw, "jobs/nightly", "--", "true")
	o.refused("no client certificate", exitFailed, "certificate required", []string{"ETCDCTL_CACERT=" + pki.CAFile, "ETCDCTL_USER=locker:" + pw}, "lock", "--endpoints", ep, "jobs/nightly", "--", "true")
	o.refused("status, wrong password", exitFailed, "authentication failed", nil, append([]string{"status"}, append(tlsFlags, "--user", "locker", "--password", wrongPW, "jobs/nightly")...)...)
	for _, tc := range []struct {
		what string
		env  []string
		args []string
		want string
	}{
		{"user without password", nil, flags("--user", "locker", "jobs/nightly", "--", "true"), "needs a password"},
		{"password without user", []string{"ETCDCTL_PASSWORD=" + pw}, flags("jobs/nightly", "--", "true"), "needs a user"},
		{"--token on etcd", nil, flags("--token", pw, "jobs/nightly", "--", "true"), "Consul only"},
		{"certificate without key", nil, []string{"lock", "--endpoints", ep, "--cert", pki.ClientCertFile, "jobs/nightly", "--", "true"}, "both --cert and --key"},
	} {
		code, _, stderr := o.run(tc.env, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: exit %d, want 2 saying %q:\n%s", tc.what, code, tc.want, stderr)
		}
	}
	if ks := keysUnder(t, root, ""); len(ks) != 0 {
		t.Errorf("keys written by refused runs: %q", ks)
	}

	// The right credentials, as flags.
	code, stdout, stderr := o.run(nil, flags("--user", "locker:"+pw, "jobs/nightly", "--", "sh", "-c", `echo "token=$HOLDFAST_TOKEN"`)...)
	if code != 0 || !strings.Contains(stdout, "token=") {
		t.Fatalf("lock with flags: exit %d; stdout %q; stderr:\n%s", code, stdout, stderr)
	}
	// As etcdctl's variables; the command (which inherits them) runs
	// status, which sees it hold the lock.
	env := []string{"ETCDCTL_ENDPOINTS=" + ep, "ETCDCTL_CACERT=" + pki.CAFile, "ETCDCTL_CERT=" + pki.ClientCertFile, "ETCDCTL_KEY=" + pki.ClientKeyFile, "ETCDCTL_USER=locker", "ETCDCTL_PASSWORD=" + pw}
	code, stdout, stderr = o.run(env, "lock", "jobs/nightly", "--", holdfastBin(t), "status", "jobs/nightly")
	if code != 0 || !strings.Contains(stdout, "holder") {
		t.Fatalf("lock and status with the environment: exit %d; stdout %q; stderr:\n%s", code, stdout, stderr)
	}
	t.Logf("status under the lock:\n%s", stdout)
	code, stdout, stderr = o.run(env, "elect", "--value", "me", "jobs/leader", "--", "sh", "-c", `echo "term=$HOLDFAST_TOKEN"`)
	if code != 0 || !strings.Contains(stdout, "term=") {
		t.Errorf("elect with the environment: exit %d; stdout %q; stderr:\n%s", code, stdout, stderr)
	}
	code, stdout, stderr = o.run(nil, append([]string{"status", "--json"}, append(tlsFlags, "--user", "locker:"+pw, "jobs/nightly")...)...)
	if code != 0 || !strings.Contains(stdout, `"name":"jobs/nightly"`) || strings.Contains(stdout, `"role":"holder"`) {
		t.Errorf("status with flags: exit %d; stdout %q; stderr:\n%s", code, stdout, stderr)
	}
	if ks := keysUnder(t, root, "jobs/"); len(ks) != 0 {
		t.Errorf("lock keys left: %q", ks)
	}
	if ks := keysUnder(t, root, "other/"); len(ks) != 0 {
		t.Errorf("keys written: %q", ks)
	}

	// Help, with every secret in the environment.
	for _, cmd := range []string{"lock", "status", "elect"} {
		if code, _, stderr := o.run(append(env, "CONSUL_HTTP_TOKEN="+pw), cmd, "--help"); code != 0 {
			t.Errorf("%s --help: exit %d: %s", cmd, code, stderr)
		}
	}
	o.noSecrets([]string{pw, strangerPW, wrongPW, rootPW}, pki.ClientKeyFile, pki.KeyFile, other.KeyFile)
}

// TestSecuredConsul: holdfast lock, elect and status against a Consul agent with
// ACLs (default deny) serving HTTPS only, with a token whose policy grants
// session write and key write on jobs/: they work with the token and CA as
// flags (--token, --cacert, https:// address) or as Consul's variables
// (CONSUL_HTTP_TOKEN, CONSUL_CACERT, CONSUL_HTTP_SSL); no token, an unknown
// token, a token without the prefix and an unknown CA each exit 125 with
// one clear line; nothing is written, no session is left, and no output
// holds a token or key material.
func TestSecuredConsul(t *testing.T) {
	pki := embedtest.TestPKI(t)
	other := embedtest.TestPKI(t)
	a := embedtest.Consul(t, embedtest.WithACL(), embedtest.WithHTTPS(pki, false))
	admin := a.Client(t)
	token := func(name, rules string) string {
		pol, _, err := admin.ACL().PolicyCreate(&api.ACLPolicy{Name: name, Rules: rules}, nil)
		if err != nil {
			t.Fatal(err)
		}
		tok, _, err := admin.ACL().TokenCreate(&api.ACLToken{Policies: []*api.ACLTokenPolicyLink{{ID: pol.ID}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tok.SecretID
	}
	lockTok := token("jobs", `session_prefix "" { policy = "write" } key_prefix "jobs/" { policy = "write" }`)
	otherTok := token("other", `session_prefix "" { policy = "write" } key_prefix "other/" { policy = "write" }`)
	wrongTok := "0badc0de-0000-4000-8000-000000000000"
	addr := "https://" + a.HTTPAddr
	o := &outputs{t: t}
	lock := func(extra ...string) []string {
		return append([]string{"lock", "--backend", "consul", "--addr", addr, "--cacert", a.CAFile, "--lock-delay", "0"}, extra...)
	}

	o.refused("no token", exitFailed, "permission denied", nil, lock("jobs/nightly", "--", "true")...)
	o.refused("unknown token", exitFailed, "ACL not found", nil, lock("--token", wrongTok, "jobs/nightly", "--", "true")...)
	o.refused("unknown token in $CONSUL_HTTP_TOKEN", exitFailed, "ACL not found", []string{"CONSUL_HTTP_TOKEN=" + wrongTok}, lock("jobs/nightly", "--", "true")...)
	o.refused("token without the prefix", exitFailed, "permission denied", nil, lock("--token", otherTok, "jobs/nightly", "--", "true")...)
	o.refused("unknown CA", exitFailed, "unknown authority", nil, "lock", "--backend", "consul", "--addr", addr, "--cacert", other.CAFile, "--token", lockTok, "jobs/nightly", "--", "true")
	o.refused("system roots", exitFailed, "unknown authority", []string{"CONSUL_HTTP_TOKEN=" + lockTok}, "lock", "--backend", "consul", "--addr", addr, "jobs/nightly", "--", "true")
	o.refused("status, unknown CA", exitFailed, "unknown authority", nil, "status", "--backend", "consul", "--addr", addr, "--cacert", other.CAFile, "--token", lockTok, "jobs/nightly")
	if code, _, stderr := o.run(nil, lock("--user", "x:y", "jobs/nightly", "--", "true")...); code != 2 || !strings.Contains(stderr, "etcd only") {
		t.Errorf("--user on Consul: exit %d, want 2:\n%s", code, stderr)
	}
	if ks, _, err := admin.KV().Keys("jobs/", "", nil); err != nil || len(ks) != 0 {
		t.Errorf("keys written by refused runs: %q (%v)", ks, err)
	}

	code, stdout, stderr := o.run(nil, lock("--token", lockTok, "jobs/nightly", "--", "sh", "-c", `echo "held=$CONSUL_LOCK_HELD"`)...)
	if code != 0 || !strings.Contains(stdout, "held=true") {
		t.Fatalf("lock with flags: exit %d; stdout %q; stderr:\n%s", code, stdout, stderr)
	}
	env := []string{"CONSUL_HTTP_ADDR=" + a.HTTPAddr, "CONSUL_HTTP_TOKEN=" + lockTok, "CONSUL_CACERT=" + a.CAFile, "CONSUL_HTTP_SSL=true"}
	code, stdout, stderr = o.run(env, "lock", "--backend", "consul", "--lock-delay", "0", "jobs/nightly", "--", holdfastBin(t), "status", "--backend", "consul", "jobs/nightly")
	if code != 0 || !strings.Contains(stdout, "holder") {
		t.Fatalf("lock and status with the environment: exit %d; stdout %q; stderr:\n%s", code, stdout, stderr)
	}
	t.Logf("status under the lock:\n%s", stdout)
	code, stdout, stderr = o.run(env, "elect", "--backend", "consul", "--lock-delay", "0", "--value", "me", "jobs/leader", "--", "sh", "-c", `echo "term=$HOLDFAST_TOKEN"`)
	if code != 0 || !strings.Contains(stdout, "term=") {
		t.Errorf("elect with the environment: exit %d; stdout %q; stderr:\n%s", code, stdout, stderr)
	}
	code, stdout, stderr = o.run(nil, "status", "--backend", "consul", "--addr", addr, "--cacert", a.CAFile, "--token", lockTok, "--json", "jobs/nightly")
	if code != 0 || !strings.Contains(stdout, `"name":"jobs/nightly"`) || strings.Contains(stdout, `"role":"holder"`) {
		t.Errorf("status with flags: exit %d; stdout %q; stderr:\n%s", code, stdout, stderr)
	}
	if ks, _, err := admin.KV().Keys("jobs/", "", nil); err != nil || len(ks) != 0 {
		t.Errorf("keys left: %q (%v)", ks, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ss, _, err := admin.Session().List((&api.QueryOptions{}).WithContext(ctx)); err != nil || len(ss) != 0 {
		t.Errorf("sessions left: %d (%v)", len(ss), err)
	}
	for _, cmd := range []string{"lock", "status"} {
		if code, _, stderr := o.run(env, cmd, "--help"); code != 0 {
			t.Errorf("%s --help: exit %d: %s", cmd, code, stderr)
		}
	}
	o.noSecrets([]string{lockTok, otherTok, wrongTok, a.MgmtToken}, pki.KeyFile, other.KeyFile)
}
