package safety

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

// The holder process is this test binary run again with these variables
// set (see init): it takes the lock, writes once to the resource, says
// "ready", and on "go" (sent after it was resumed) reports what it finds.
const (
	envHolder   = "HOLDFAST_SAFETY_HOLDER" // "etcd" or "consul"
	envAddr     = "HOLDFAST_SAFETY_ADDR"
	envName     = "HOLDFAST_SAFETY_NAME"
	envResource = "HOLDFAST_SAFETY_RESOURCE"
)

// resumed is what a holder reports after it was paused and resumed.
type resumed struct {
	CtxErr   string // its grant context's error when it looked, first thing
	WriteErr string // the resource's answer to its late write
	TxnErr   string // its guarded write's error
	TxnKey   bool   // whether the guarded write's key exists (it must not)
}

func init() {
	if os.Getenv(envHolder) != "" {
		os.Exit(holderMain())
	}
}

// holderMain is the holder process.
func holderMain() int {
	ctx := context.Background()
	fail := func(err error) int { fmt.Println("error", err); return 1 }
	backend, addr, name, res := os.Getenv(envHolder), os.Getenv(envAddr), os.Getenv(envName), os.Getenv(envResource)
	var g holdfast.Grant
	var guarded func() (bool, error)
	switch backend {
	case "etcd":
		s, err := etcd.Dial(ctx, []string{addr}, etcd.WithTTL(etcd.MinTTL))
		if err != nil {
			return fail(err)
		}
		defer s.Close()
		m, err := etcd.NewMutex(s, name)
		if err != nil {
			return fail(err)
		}
		eg, err := m.Lock(ctx)
		if err != nil {
			return fail(err)
		}
		g = eg
		guarded = func() (bool, error) {
			_, err := eg.Txn(ctx, clientv3.OpPut("safety-late/"+name, "late"))
			resp, gerr := s.Client().Get(ctx, "safety-late/"+name)
			return gerr == nil && len(resp.Kvs) > 0, err
		}
	case "consul":
		s, err := consul.Dial(ctx, addr, consul.WithTTL(consul.MinTTL), consul.WithLockDelay(0))
		if err != nil {
			return fail(err)
		}
		defer s.Close()
		m, err := consul.NewMutex(s, name)
		if err != nil {
			return fail(err)
		}
		cg, err := m.Lock(ctx)
		if err != nil {
			return fail(err)
		}
		g = cg
		guarded = func() (bool, error) {
			_, err := cg.Txn(ctx, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: "safety-late/" + name, Value: []byte("late")}}})
			pair, _, gerr := s.Client().KV().Get("safety-late/"+name, nil)
			return gerr == nil && pair != nil, err
		}
	default:
		return fail(fmt.Errorf("unknown backend %q", backend))
	}
	write := func() error {
		resp, err := http.Post(fmt.Sprintf("%s?client=1&token=%d", res, g.Token()), "text/plain", nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return errors.New(strings.TrimSpace(string(b)))
		}
		return nil
	}
	fmt.Println("granted", g.Token())
	if err := write(); err != nil {
		return fail(err)
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	in.Scan() // "go": we were stopped and resumed
	var r resumed
	if err := g.Context().Err(); err != nil {
		r.CtxErr = context.Cause(g.Context()).Error()
	}
	if err := write(); err != nil {
		r.WriteErr = err.Error()
	}
	exists, err := guarded()
	if err != nil {
		r.TxnErr = err.Error()
	}
	r.TxnKey = exists
	b, _ := json.Marshal(r)
	fmt.Println("resumed", string(b))
	return 0
}

// resourceServer serves res over HTTP: POST ?client=&token= writes.
func resourceServer(t *testing.T, res *Resource) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client, _ := strconv.Atoi(r.URL.Query().Get("client"))
		token, err := strconv.ParseUint(r.URL.Query().Get("token"), 10, 64)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := res.Write(client, holdfast.Token(token)); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// holderProc is a running holder process.
type holderProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startHolder(t *testing.T, backend, addr, name, resource string) *holderProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envHolder+"="+backend, envAddr+"="+addr, envName+"="+name, envResource+"="+resource)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holderProc{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return h
}

// expect waits for a line starting with prefix and returns the rest.
func (h *holderProc) expect(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-h.lines:
			if !ok {
				t.Fatalf("holder exited before %q", prefix)
			}
			if rest, found := strings.CutPrefix(l, prefix); found {
				return strings.TrimSpace(rest)
			}
			if strings.HasPrefix(l, "error") {
				t.Fatalf("holder: %s", l)
			}
		case <-timer.C:
			t.Fatalf("holder did not say %q within %v", prefix, within)
		}
	}
}

// TestHolderPause: a holder in its own process is stopped (SIGSTOP) for
// longer than its TTL while it holds the lock; another client gets the lock
// and writes; when the holder resumes (SIGCONT), its grant context is done
// at its first look, its late write is refused by the fenced resource, and
// its guarded write applies nothing. Then SIGKILL of a holder: the next
// waiter gets the lock within TTL (+ lock-delay, 0 here).
func TestHolderPause(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"etcd", "consul"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			res := NewResource()
			srv := resourceServer(t, res)
			name := fmt.Sprintf("safety/pause/%d", time.Now().UnixNano())
			var addr string
			var ttl time.Duration
			var lock func(ctx context.Context) (holdfast.Grant, error)
			switch backend {
			case "etcd":
				c := etcdtest.Etcd(t)
				addr, ttl = c.Endpoints()[0], etcd.MinTTL
				s, err := etcd.NewSession(context.Background(), c.Client(t), etcd.WithTTL(etcd.MinTTL))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				m, err := etcd.NewMutex(s, name)
				if err != nil {
					t.Fatal(err)
				}
				lock = func(ctx context.Context) (holdfast.Grant, error) { return holdfast.AsLocker(m).Lock(ctx) }
			case "consul":
				a := embedtest.Consul(t)
				addr, ttl = a.HTTPAddr, consul.MinTTL
				s, err := consul.NewSession(context.Background(), a.Client(t), consul.WithTTL(consul.MinTTL), consul.WithLockDelay(0))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				m, err := consul.NewMutex(s, name)
				if err != nil {
					t.Fatal(err)
				}
				lock = func(ctx context.Context) (holdfast.Grant, error) { return holdfast.AsLocker(m).Lock(ctx) }
			}

			// Pause.
			h := startHolder(t, backend, addr, name, srv.URL)
			old, _ := strconv.ParseUint(h.expect(t, "granted", 30*time.Second), 10, 64)
			h.expect(t, "ready", 10*time.Second)
			if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 3*ttl+30*time.Second)
			defer cancel()
			g, err := lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: the waiter got the lock %v after the holder was stopped (TTL %v), token %d after %d", backend, time.Since(stopped).Round(time.Millisecond), ttl, g.Token(), old)
			if err := res.Write(2, g.Token()); err != nil {
				t.Fatalf("the new holder's write: %v", err)
			}
			if err := h.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(h.stdin, "go\n"); err != nil {
				t.Fatal(err)
			}
			var r resumed
			if err := json.Unmarshal([]byte(h.expect(t, "resumed", 30*time.Second)), &r); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: resumed holder: %+v", backend, r)
			if r.CtxErr == "" {
				t.Error("the resumed holder's grant context was not done at its first look")
			}
			if !strings.Contains(r.WriteErr, "stale fencing token") {
				t.Errorf("the resumed holder's late write: %q, want it refused as stale", r.WriteErr)
			}
			if r.TxnErr == "" || r.TxnKey {
				t.Errorf("the resumed holder's guarded write: error %q, key written %v: want an error and nothing written", r.TxnErr, r.TxnKey)
			}
			if bad := CheckFence(res.Writes()); len(bad) > 0 {
				t.Errorf("fence: %v", bad)
			}
			if err := g.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}

			// Kill.
			k := startHolder(t, backend, addr, name, srv.URL)
			k.expect(t, "ready", 30*time.Second)
			if err := k.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			g, err = lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(killed)
			t.Logf("%s: the waiter got the lock %v after the holder was killed (TTL %v)", backend, took.Round(time.Millisecond), ttl)
			// Consul invalidates a session whose TTL ran out only after up
			// to twice the TTL (its documented grace), etcd after the TTL.
			bound := ttl + 2*time.Second
			if backend == "consul" {
				bound = 2*ttl + 2*time.Second
			}
			if took > bound {
				t.Errorf("takeover after SIGKILL took %v, want within %v (TTL %v)", took, bound, ttl)
			}
			_ = g.Unlock(context.Background())
		})
	}
}
