package consul

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/internal/core"
)

// TestClaimSessionLeftover: a claim session whose creation Consul applied
// but whose answer never reached the claim is looked up by its unique name:
// with the answer lost, it is found and the claim takes it (its Unlock
// destroys it); applied after the claim's context ended (as when a frozen
// agent resumes), it is destroyed. None is left once Claim or Unlock
// returned (within core.ClaimCleanup), in each mode.
func TestClaimSessionLeftover(t *testing.T) {
	t.Parallel()
	a := agent(t)
	admin := a.Client(t)
	for _, mode := range []embedtest.FaultMode{embedtest.FaultLoseAnswer, embedtest.FaultLate} {
		t.Run(mode.String(), func(t *testing.T) {
			c, ft := faultClient(t, a)
			s := newSession(t, c)
			name := uniqueName(t)
			o, err := NewOnce(s, name, holdfast.Schedule{Every: time.Hour, AtMost: 2 * MinTTL})
			if err != nil {
				t.Fatal(err)
			}
			f := ft.Inject(func(method, path string, body []byte) bool {
				return method == http.MethodPut && path == "/v1/session/create" && bytes.Contains(body, []byte("holdfast claim "+name))
			}, 1, mode)
			f.Late = 100 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			cl, err := o.Claim(ctx)
			select {
			case <-f.Fired():
			default:
				t.Fatal("the fault did not fire")
			}
			switch {
			case mode == embedtest.FaultLate && err == nil:
				t.Fatalf("claim %v succeeded, want the creation's error", cl.id)
			case mode == embedtest.FaultLoseAnswer && err != nil:
				t.Fatalf("claim with the creation's answer lost: %v", err)
			case mode == embedtest.FaultLoseAnswer:
				if ids := claimSessions(t, admin, name); len(ids) != 1 || ids[0] != cl.id {
					t.Errorf("claim sessions %v, want the claim's %s alone", ids, cl.id)
				}
				if err := cl.Unlock(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			<-f.Done()
			waitFor(t, core.ClaimCleanup, "no claim session left", func() bool { return len(claimSessions(t, admin, name)) == 0 })
		})
	}
}

// claimSessions lists the claim sessions of the claim called name.
func claimSessions(t testing.TB, c *api.Client, name string) []string {
	t.Helper()
	all, _, err := c.Session().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range all {
		if s.Name == "holdfast claim "+name || strings.HasPrefix(s.Name, "holdfast claim "+name+" ") {
			ids = append(ids, s.ID)
		}
	}
	return ids
}

// TestClaimAnswerLost: a claim transaction that Consul applied but whose
// answer never came (the connection dropped, or the answer came after the
// request's bound) still gives its claim: the mark read back names the
// claim's session, so the claimant runs, rather than every replica finding
// the period taken and nobody running it.
func TestClaimAnswerLost(t *testing.T) {
	t.Parallel()
	a := agent(t)
	c, ft := faultClient(t, a)
	s := newSession(t, c)
	name := uniqueName(t)
	o, err := NewOnce(s, name, holdfast.Schedule{Every: time.Hour, AtMost: 2 * MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	f := ft.Inject(func(method, path string, body []byte) bool {
		return method == http.MethodPut && path == "/v1/txn" && bytes.Contains(body, []byte(name+"/.run"))
	}, 1, embedtest.FaultLoseAnswer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := o.Claim(ctx)
	select {
	case <-f.Fired():
	default:
		t.Fatal("the fault did not fire")
	}
	if err != nil {
		t.Fatalf("claim whose transaction applied without an answer: %v", err)
	}
	e, _, err := a.Client(t).KV().Get(name+"/.run", nil)
	if err != nil || e == nil || e.Session != cl.id || holdfast.Token(e.ModifyIndex) != cl.Token() {
		t.Fatalf("run mark %+v (%v), want one held by the claim's session %s at its token %d", e, err, cl.id, cl.Token())
	}
	if err := cl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, core.ClaimCleanup, "no claim session left", func() bool { return len(claimSessions(t, a.Client(t), name)) == 0 })
}
