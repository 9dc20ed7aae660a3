package etcd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// secureCtx bounds a Dial that cannot connect (a TLS failure makes etcd's
// client wait for a connection until the deadline).
func secureCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// lockUnlock takes and releases name through s, with a guarded write under
// it, and returns the grant's token.
func lockUnlock(t *testing.T, s *etcd.Session, name string) holdfast.Token {
	t.Helper()
	ctx := secureCtx(t)
	g, err := newMutex(t, s, name).Lock(ctx)
	if err != nil {
		t.Fatalf("Lock %s: %v", name, err)
	}
	if resp, err := g.Txn(ctx, clientv3.OpPut(name+"-data", "x")); err != nil || !resp.Succeeded {
		t.Fatalf("guarded write under %s: %v", name, err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatalf("Unlock %s: %v", name, err)
	}
	return g.Token()
}

// noLeases fails t if the cluster holds a lease (a session left behind).
func noLeases(t *testing.T, root *clientv3.Client) {
	t.Helper()
	resp, err := root.Leases(secureCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Leases) != 0 {
		t.Errorf("%d lease(s) left: %v", len(resp.Leases), resp.Leases)
	}
}

// TestTLS: over mutual TLS, Dial with the CA and a client certificate (as
// files, or as a tls.Config; https:// or bare host:port endpoints) takes
// locks; an unknown CA, a missing client certificate or one from another CA
// fail with an error that says so, leaving no key and no lease; Dial-only
// options are refused by NewSession; bad files and an http:// endpoint
// with TLS are invalid arguments.
func TestTLS(t *testing.T) {
	pki := embedtest.TestPKI(t)
	other := embedtest.TestPKI(t) // a CA the cluster does not know, and that does not know it
	c := etcdtest.Etcd(t, etcdtest.WithEtcdTLS(pki, true))
	root := c.Client(t)
	eps := c.Endpoints()
	if !strings.HasPrefix(eps[0], "https://") {
		t.Fatalf("endpoints %v, want https", eps)
	}

	s, err := etcd.Dial(secureCtx(t), eps, etcd.WithTLSFiles(pki.CAFile, pki.ClientCertFile, pki.ClientKeyFile), etcd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("Dial over mTLS with files: %v", err)
	}
	t1 := lockUnlock(t, s, "mtls/files")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	cfg, err := pki.ClientTLS(true)
	if err != nil {
		t.Fatal(err)
	}
	bare := []string{strings.TrimPrefix(eps[0], "https://")}
	s, err = etcd.Dial(secureCtx(t), bare, etcd.WithTLS(cfg), etcd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("Dial over mTLS with a tls.Config, endpoint %s: %v", bare[0], err)
	}
	if t2 := lockUnlock(t, s, "mtls/config"); t2 <= t1 {
		t.Errorf("token %d after %d", t2, t1)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := root.Delete(secureCtx(t), "mtls/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}

	// Each refused Dial waits out its context (3 s): they run at once, their
	// deadlines 250 ms apart, so that the quick probes (TLS handshakes of at
	// most 100 ms) that explain each one's failure at its deadline do not
	// all run at the same moment.
	refusals := []struct {
		name string
		opts []etcd.SessionOption
		want []string // one of them must be in the error
	}{
		{"unknown CA", []etcd.SessionOption{etcd.WithTLSFiles(other.CAFile, pki.ClientCertFile, pki.ClientKeyFile)}, []string{"unknown authority"}},
		{"system roots", []etcd.SessionOption{etcd.WithTLS(&tls.Config{Certificates: cfg.Certificates})}, []string{"unknown authority"}},
		{"no client certificate", []etcd.SessionOption{etcd.WithTLSFiles(pki.CAFile, "", "")}, []string{"certificate required", "bad certificate"}},
		{"client certificate of another CA", []etcd.SessionOption{etcd.WithTLSFiles(pki.CAFile, other.ClientCertFile, other.ClientKeyFile)}, []string{"certificate required", "unknown certificate authority", "bad certificate"}},
		{"no TLS options, https:// endpoint", nil, []string{"unknown authority"}},
		{"no TLS options, host:port", []etcd.SessionOption{}, []string{"speaks TLS"}},
	}
	type refusal struct {
		s    *etcd.Session
		err  error
		took time.Duration
		ctx  time.Duration // the Dial's context's timeout
	}
	got := make([]refusal, len(refusals))
	var wg sync.WaitGroup
	for i, tc := range refusals {
		ep := eps
		if tc.opts != nil && len(tc.opts) == 0 {
			ep = bare
		}
		timeout := 3*time.Second + time.Duration(i)*250*time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		t.Cleanup(cancel)
		wg.Go(func() {
			start := time.Now()
			s, err := etcd.Dial(ctx, ep, append(tc.opts, etcd.WithTTL(5*time.Second))...)
			got[i] = refusal{s, err, time.Since(start), timeout}
		})
	}
	wg.Wait()
	for i, tc := range refusals {
		err, took := got[i].err, got[i].took
		if err == nil {
			got[i].s.Close()
			t.Errorf("%s: Dial succeeded", tc.name)
			continue
		}
		found := false
		for _, w := range tc.want {
			found = found || strings.Contains(err.Error(), w)
		}
		if !found {
			t.Errorf("%s: Dial: %v; want it to say %q", tc.name, err, tc.want)
		}
		if took > got[i].ctx+2*time.Second {
			t.Errorf("%s: Dial took %v with a %v context", tc.name, took, got[i].ctx)
		}
		t.Logf("%s (%v): %v", tc.name, took.Round(time.Millisecond), err)
	}
	if ks := keys(t, root, ""); len(ks) != 0 {
		t.Errorf("keys written: %q", ks)
	}
	noLeases(t, root)

	// A cancelled Dial returns at once, with or without credentials (which
	// clientv3.New checks before it returns).
	for name, opts := range map[string][]etcd.SessionOption{
		"TLS":             {etcd.WithTLSFiles(pki.CAFile, "", "")},
		"TLS+credentials": {etcd.WithTLSFiles(pki.CAFile, "", ""), etcd.WithCredentials("u", "p")},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(300*time.Millisecond, cancel)
		start := time.Now()
		_, err := etcd.Dial(ctx, eps, opts...)
		took := time.Since(start)
		if !errors.Is(err, context.Canceled) || took > 800*time.Millisecond {
			t.Errorf("%s: Dial cancelled after 300 ms: %v after %v, want Canceled at once", name, err, took)
		}
		t.Logf("%s: cancelled Dial returned after %v: %v", name, took.Round(time.Millisecond), err)
	}

	// Invalid arguments, before any request.
	keyOnly := etcd.WithTLSFiles(pki.CAFile, "", pki.ClientKeyFile)
	for name, opts := range map[string][]etcd.SessionOption{
		"http:// endpoint with TLS": {etcd.WithTLS(cfg)},
		"missing CA file":           {etcd.WithTLSFiles(pki.CAFile+".missing", "", "")},
		"key file as CA":            {etcd.WithTLSFiles(pki.ClientKeyFile, "", "")},
		"key without certificate":   {keyOnly},
		"both TLS options":          {etcd.WithTLS(cfg), etcd.WithTLSFiles(pki.CAFile, "", "")},
		"empty user":                {etcd.WithCredentials("", "pw")},
		"empty password":            {etcd.WithCredentials("alice", "")},
	} {
		ep := eps
		if strings.HasPrefix(name, "http://") {
			ep = []string{"http://" + bare[0]}
		}
		if _, err := etcd.Dial(secureCtx(t), ep, opts...); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("%s: Dial: %v, want ErrInvalidArgument", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	for _, o := range []etcd.SessionOption{etcd.WithTLS(cfg), etcd.WithTLSFiles(pki.CAFile, "", ""), etcd.WithCredentials("root", "pw")} {
		if _, err := etcd.NewSession(secureCtx(t), root, o); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("NewSession with a Dial-only option: %v, want ErrInvalidArgument", err)
		} else {
			t.Logf("NewSession: %v", err)
		}
	}
	noLeases(t, root)
}

// TestAuth: with TLS and etcd's authentication and RBAC enabled, a user
// whose role grants only the prefix jobs/ takes locks there (and writes
// under its grant there only); a wrong password, an unknown user, no
// credentials and a user whose role lacks the prefix all get
// ErrPermissionDenied, with nothing written (checked by root), and no error
// contains a password.
func TestAuth(t *testing.T) {
	pki := embedtest.TestPKI(t)
	c := etcdtest.Etcd(t, etcdtest.WithEtcdTLS(pki, false), etcdtest.WithEtcdAuth())
	root := c.Client(t)
	const pw, strangerPW, wrongPW = "locker-Secret-1", "stranger-Secret-2", "wrong-Secret-3"
	if err := c.AddUser("locker", pw, "jobs/"); err != nil {
		t.Fatal(err)
	}
	if err := c.AddUser("stranger", strangerPW, "other/"); err != nil {
		t.Fatal(err)
	}
	eps := c.Endpoints()
	tlsOpt := etcd.WithTLSFiles(pki.CAFile, "", "")
	noSecret := func(what string, err error) {
		t.Helper()
		for _, s := range []string{pw, strangerPW, wrongPW} {
			if err != nil && strings.Contains(err.Error(), s) {
				t.Errorf("%s: the error shows a password: %v", what, err)
			}
		}
	}

	// Refusals first: nothing of theirs may be found afterwards.
	for _, tc := range []struct {
		name       string
		user, pass string
	}{
		{"wrong password", "locker", wrongPW},
		{"unknown user", "nobody", pw},
	} {
		_, err := etcd.Dial(secureCtx(t), eps, tlsOpt, etcd.WithCredentials(tc.user, tc.pass), etcd.WithTTL(5*time.Second))
		if !errors.Is(err, holdfast.ErrPermissionDenied) {
			t.Errorf("%s: Dial: %v, want ErrPermissionDenied", tc.name, err)
		}
		noSecret(tc.name, err)
		t.Logf("%s: %v", tc.name, err)
	}
	// A lease is no key: a session without credentials may or may not be
	// granted one, but its locks are refused.
	if s, err := etcd.Dial(secureCtx(t), eps, tlsOpt, etcd.WithTTL(5*time.Second)); err != nil {
		if !errors.Is(err, holdfast.ErrPermissionDenied) {
			t.Errorf("no credentials: Dial: %v, want ErrPermissionDenied", err)
		}
		t.Logf("no credentials: Dial: %v", err)
	} else {
		_, err := newMutex(t, s, "jobs/nightly").Lock(secureCtx(t))
		if !errors.Is(err, holdfast.ErrPermissionDenied) {
			t.Errorf("no credentials: Lock: %v, want ErrPermissionDenied", err)
		}
		t.Logf("no credentials: Lock: %v", err)
		s.Close()
	}
	s, err := etcd.Dial(secureCtx(t), eps, tlsOpt, etcd.WithCredentials("stranger", strangerPW), etcd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("stranger: Dial: %v", err)
	}
	_, err = newMutex(t, s, "jobs/nightly").Lock(secureCtx(t))
	if !errors.Is(err, holdfast.ErrPermissionDenied) {
		t.Errorf("stranger: Lock outside its prefix: %v, want ErrPermissionDenied", err)
	}
	noSecret("stranger Lock", err)
	t.Logf("stranger: Lock: %v", err)
	if _, err := newMutex(t, s, "jobs/nightly").TryLock(secureCtx(t)); !errors.Is(err, holdfast.ErrPermissionDenied) {
		t.Errorf("stranger: TryLock outside its prefix: %v, want ErrPermissionDenied", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("stranger: Close: %v", err)
	}
	if ks := keys(t, root, ""); len(ks) != 0 {
		t.Errorf("keys written by refused clients: %q", ks)
	}
	noLeases(t, root)

	// The user confined to jobs/ locks there, and only writes there.
	s, err = etcd.Dial(secureCtx(t), eps, tlsOpt, etcd.WithCredentials("locker", pw), etcd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("locker: Dial: %v", err)
	}
	defer s.Close()
	lockUnlock(t, s, "jobs/nightly")
	g, err := newMutex(t, s, "jobs/nightly").Lock(secureCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := etcd.Dial(secureCtx(t), eps, tlsOpt, etcd.WithCredentials("locker", pw), etcd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := newMutex(t, s2, "jobs/nightly").TryLock(secureCtx(t)); !errors.Is(err, holdfast.ErrLocked) {
		t.Errorf("second locker: TryLock: %v, want ErrLocked", err)
	}
	if _, err := g.Txn(secureCtx(t), clientv3.OpPut("secret/x", "x")); !errors.Is(err, holdfast.ErrPermissionDenied) {
		t.Errorf("guarded write outside jobs/: %v, want ErrPermissionDenied", err)
	}
	if err := g.Unlock(secureCtx(t)); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, root, "secret/"); len(ks) != 0 {
		t.Errorf("written outside the prefix: %q", ks)
	}
	if ks := keys(t, root, "jobs/nightly/"); len(ks) != 0 {
		t.Errorf("lock keys left: %q", ks)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	if err := s2.Close(); err != nil {
		t.Error(err)
	}
	noLeases(t, root)
}
