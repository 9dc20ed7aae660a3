package consul

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
)

// policyToken creates a policy with rules and a token for it, and returns
// the token's secret.
func policyToken(t *testing.T, admin *api.Client, name, rules string) string {
	t.Helper()
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

// TestSecuredAgent: against an agent with ACLs (default deny) serving HTTPS
// only, a token whose policy grants session write and key write on jobs/
// only takes locks there through Dial with WithToken and WithTLSFiles or
// WithTLS, or through the environment (CONSUL_HTTP_TOKEN, CONSUL_CACERT,
// CONSUL_HTTP_SSL); no token, an unknown token and a token without the
// prefix get ErrPermissionDenied; an unknown CA fails at once saying so;
// nothing is written (checked with the management token), no session is
// left, and no error contains a token.
func TestSecuredAgent(t *testing.T) {
	pki := embedtest.TestPKI(t)
	other := embedtest.TestPKI(t)
	a := embedtest.Consul(t, embedtest.WithACL(), embedtest.WithHTTPS(pki, false))
	admin := a.Client(t)
	lockTok := policyToken(t, admin, "jobs-locks", `session_prefix "" { policy = "write" } key_prefix "jobs/" { policy = "write" }`)
	otherTok := policyToken(t, admin, "other-locks", `session_prefix "" { policy = "write" } key_prefix "other/" { policy = "write" }`)
	wrongTok := "00000000-dead-beef-0000-000000000000"
	for _, v := range []string{"CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_CACERT", "CONSUL_HTTP_SSL", "CONSUL_HTTP_ADDR", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY"} {
		t.Setenv(v, "")
	}
	secrets := []string{lockTok, otherTok, wrongTok, a.MgmtToken}
	noSecret := func(what string, err error) {
		t.Helper()
		for _, s := range secrets {
			if err != nil && strings.Contains(err.Error(), s) {
				t.Errorf("%s: the error shows a token: %v", what, err)
			}
		}
	}
	ctx := func() context.Context { return timeout(t, 10*time.Second) }
	caOnly := WithTLSFiles(a.CAFile, "", "")
	cfg := &tls.Config{RootCAs: pki.CAPool()}

	// Refusals first.
	for _, tc := range []struct {
		name string
		addr string
		opts []SessionOption
		want error  // errors.Is, if not nil
		says string // in the error
	}{
		{"no token", a.HTTPAddr, []SessionOption{caOnly}, holdfast.ErrPermissionDenied, "Permission denied"},
		{"unknown token", a.HTTPAddr, []SessionOption{caOnly, WithToken(wrongTok)}, holdfast.ErrPermissionDenied, "ACL not found"},
		{"unknown CA", a.HTTPAddr, []SessionOption{WithTLSFiles(other.CAFile, "", ""), WithToken(lockTok)}, nil, "unknown authority"},
		{"system roots", "https://" + a.HTTPAddr, []SessionOption{WithToken(lockTok)}, nil, "unknown authority"},
		{"plain HTTP to HTTPS", a.HTTPAddr, []SessionOption{WithToken(lockTok)}, nil, "HTTPS"},
		{"http:// with TLS", "http://" + a.HTTPAddr, []SessionOption{WithTLS(cfg), WithToken(lockTok)}, holdfast.ErrInvalidArgument, "plain http"},
		{"empty token", a.HTTPAddr, []SessionOption{caOnly, WithToken("")}, holdfast.ErrInvalidArgument, "empty token"},
		{"missing CA file", a.HTTPAddr, []SessionOption{WithTLSFiles(a.CAFile+".missing", "", "")}, holdfast.ErrInvalidArgument, "no such file"},
		{"both TLS options", a.HTTPAddr, []SessionOption{caOnly, WithTLS(cfg)}, holdfast.ErrInvalidArgument, "exclude"},
	} {
		start := time.Now()
		s, err := Dial(ctx(), tc.addr, append(tc.opts, WithLockDelay(0))...)
		took := time.Since(start)
		if err == nil {
			s.Close()
			t.Errorf("%s: Dial succeeded", tc.name)
			continue
		}
		if tc.want != nil && !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: Dial: %v; want %v saying %q", tc.name, err, tc.want, tc.says)
		}
		if took > 2*time.Second {
			t.Errorf("%s: Dial took %v", tc.name, took)
		}
		noSecret(tc.name, err)
		t.Logf("%s (%v): %v", tc.name, took.Round(time.Millisecond), err)
	}
	for _, o := range []SessionOption{WithToken(lockTok), WithTLS(cfg), caOnly} {
		_, err := NewSession(ctx(), admin, o)
		if !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("NewSession with a Dial-only option: %v, want ErrInvalidArgument", err)
		}
		noSecret("NewSession", err)
	}
	s, err := Dial(ctx(), a.HTTPAddr, caOnly, WithToken(otherTok), WithLockDelay(0))
	if err != nil {
		t.Fatalf("token for other/: Dial: %v", err)
	}
	for _, try := range []bool{false, true} {
		m := newMutex(t, s, "jobs/nightly")
		var err error
		if try {
			_, err = m.TryLock(ctx())
		} else {
			_, err = m.Lock(ctx())
		}
		if !errors.Is(err, holdfast.ErrPermissionDenied) {
			t.Errorf("token for other/: lock on jobs/ (try %v): %v, want ErrPermissionDenied", try, err)
		}
		noSecret("Lock", err)
		t.Logf("token for other/, try %v: %v", try, err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if ks := keys(t, admin, "jobs"); len(ks) != 0 {
		t.Errorf("keys written by refused clients: %q", ks)
	}
	if ss, _, err := admin.Session().List(nil); err != nil || len(ss) != 0 {
		t.Errorf("sessions left: %d (%v)", len(ss), err)
	}

	// The right token and CA, three ways.
	lock := func(how string, s *Session, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: Dial: %v", how, err)
		}
		defer s.Close()
		g, err := newMutex(t, s, "jobs/nightly").Lock(ctx())
		if err != nil {
			t.Fatalf("%s: Lock: %v", how, err)
		}
		if _, err := newMutex(t, s, "secret/x").TryLock(ctx()); !errors.Is(err, holdfast.ErrPermissionDenied) {
			t.Errorf("%s: TryLock outside jobs/: %v, want ErrPermissionDenied", how, err)
		}
		if err := g.Unlock(ctx()); err != nil {
			t.Fatalf("%s: Unlock: %v", how, err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("%s: Close: %v", how, err)
		}
	}
	s, err = Dial(ctx(), a.HTTPAddr, caOnly, WithToken(lockTok), WithLockDelay(0))
	lock("WithTLSFiles, host:port", s, err)
	s, err = Dial(ctx(), "https://"+a.HTTPAddr, WithTLS(cfg), WithToken(lockTok), WithLockDelay(0))
	lock("WithTLS, https://", s, err)
	t.Setenv("CONSUL_HTTP_TOKEN", lockTok)
	t.Setenv("CONSUL_CACERT", a.CAFile)
	t.Setenv("CONSUL_HTTP_SSL", "true")
	s, err = Dial(ctx(), a.HTTPAddr, WithLockDelay(0))
	lock("environment", s, err)

	if ks := keys(t, admin, "jobs/nightly"); len(ks) != 0 {
		t.Errorf("keys left: %q", ks)
	}
	if ks := keys(t, admin, "secret"); len(ks) != 0 {
		t.Errorf("keys written outside jobs/: %q", ks)
	}
	if ss, _, err := admin.Session().List(nil); err != nil || len(ss) != 0 {
		t.Errorf("sessions left: %d (%v)", len(ss), err)
	}
}

// TestConfigHidesToken: the configuration WithToken fills never formats the
// token, whatever the verb.
func TestConfigHidesToken(t *testing.T) {
	const tok = "5ec2e7-token-for-fmt"
	cfg, err := newSessionConfig([]SessionOption{WithToken(tok), WithTLSFiles("ca.pem", "", "")})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.dial.token.Reveal() != tok {
		t.Fatal("token not kept for Dial")
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%q"} {
		for _, arg := range []any{cfg, &cfg, cfg.dial} {
			if out := fmt.Sprintf(verb, arg); strings.Contains(out, tok) || strings.Contains(out, fmt.Sprintf("%x", tok)) {
				t.Errorf("Sprintf(%q, %T) shows the token: %s", verb, arg, out)
			}
		}
	}
}

// TestMutualTLSAgent: an agent that requires client certificates accepts
// Dial with one (WithTLSFiles, or Consul's variables) and refuses Dial
// without one, or with one of another CA, at once, saying "certificate
// required" (whatever net/http made of it), writing nothing.
func TestMutualTLSAgent(t *testing.T) {
	pki := embedtest.TestPKI(t)
	other := embedtest.TestPKI(t)
	a := embedtest.Consul(t, embedtest.WithHTTPS(pki, true))
	admin := a.Client(t)
	for _, v := range []string{"CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_CACERT", "CONSUL_HTTP_SSL", "CONSUL_HTTP_ADDR", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY"} {
		t.Setenv(v, "")
	}
	for name, opts := range map[string][]SessionOption{
		"no client certificate":            {WithTLSFiles(pki.CAFile, "", "")},
		"client certificate of another CA": {WithTLSFiles(pki.CAFile, other.ClientCertFile, other.ClientKeyFile)},
	} {
		start := time.Now()
		s, err := Dial(timeout(t, 10*time.Second), a.HTTPAddr, opts...)
		took := time.Since(start)
		if err == nil {
			s.Close()
			t.Errorf("%s: Dial succeeded", name)
			continue
		}
		if !strings.Contains(err.Error(), "certificate required") && !strings.Contains(err.Error(), "bad certificate") || took > 2*time.Second {
			t.Errorf("%s: Dial: %v after %v; want a certificate error at once", name, err, took)
		}
		t.Logf("%s (%v): %v", name, took.Round(time.Millisecond), err)
	}
	if ks := keys(t, admin, "jobs"); len(ks) != 0 {
		t.Errorf("keys written: %q", ks)
	}
	if ss, _, err := admin.Session().List(nil); err != nil || len(ss) != 0 {
		t.Errorf("sessions: %d (%v)", len(ss), err)
	}

	lock := func(how string, s *Session, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: Dial: %v", how, err)
		}
		defer s.Close()
		g, err := newMutex(t, s, "jobs/nightly").Lock(timeout(t, 10*time.Second))
		if err != nil {
			t.Fatalf("%s: Lock: %v", how, err)
		}
		if err := g.Unlock(timeout(t, 10*time.Second)); err != nil {
			t.Fatalf("%s: Unlock: %v", how, err)
		}
	}
	s, err := Dial(timeout(t, 10*time.Second), a.HTTPAddr, WithTLSFiles(pki.CAFile, pki.ClientCertFile, pki.ClientKeyFile), WithLockDelay(0))
	lock("WithTLSFiles", s, err)
	t.Setenv("CONSUL_CACERT", pki.CAFile)
	t.Setenv("CONSUL_CLIENT_CERT", pki.ClientCertFile)
	t.Setenv("CONSUL_CLIENT_KEY", pki.ClientKeyFile)
	t.Setenv("CONSUL_HTTP_SSL", "true")
	s, err = Dial(timeout(t, 10*time.Second), a.HTTPAddr, WithLockDelay(0))
	lock("environment", s, err)
}
