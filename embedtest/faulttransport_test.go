package embedtest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// TestFaultTransport: against a real agent, each mode does what it says to
// the second transaction that writes the key (the first goes through):
// refused (500, nothing written), applied with its answer lost (an error,
// the key written), delivered late (the caller's context error, the key
// written only after that).
func TestFaultTransport(t *testing.T) {
	a := Consul(t)
	admin := a.Client(t)
	for _, mode := range FaultModes {
		t.Run(mode.String(), func(t *testing.T) {
			ft := &FaultTransport{}
			defer ft.Close()
			var seen int
			ft.Observe = func(method, path string, body []byte) {
				if path == "/v1/txn" {
					seen++
				}
			}
			c, err := a.NewClient(func(cfg *api.Config) { cfg.HttpClient = &http.Client{Transport: ft} })
			if err != nil {
				t.Fatal(err)
			}
			key := "faults/" + mode.String()
			f := ft.Inject(TxnHas(string(api.KVSet), key), 2, mode)
			f.Late = 100 * time.Millisecond
			put := func(ctx context.Context, v string) error {
				_, _, _, err := c.Txn().Txn(api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: key, Value: []byte(v)}}}, (&api.QueryOptions{}).WithContext(ctx))
				return err
			}
			get := func() string {
				p, _, err := admin.KV().Get(key, nil)
				if err != nil {
					t.Fatal(err)
				}
				if p == nil {
					return ""
				}
				return string(p.Value)
			}
			if err := put(context.Background(), "1"); err != nil {
				t.Fatalf("first put (not faulted): %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = put(ctx, "2")
			select {
			case <-f.Fired():
			default:
				t.Fatal("the fault did not fire on the second matching request")
			}
			switch mode {
			case FaultRefuse:
				if err == nil || !strings.Contains(err.Error(), ErrFaultInjected.Error()) {
					t.Fatalf("refused: %v, want the injected 500", err)
				}
				if v := get(); v != "1" {
					t.Fatalf("refused request applied: %q", v)
				}
			case FaultLoseAnswer:
				if !errors.Is(err, ErrFaultInjected) {
					t.Fatalf("answer lost: %v, want ErrFaultInjected", err)
				}
				if v := get(); v != "2" {
					t.Fatalf("answer lost, request not applied: %q", v)
				}
			case FaultLate:
				if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) < 300*time.Millisecond {
					t.Fatalf("late: %v after %v, want the caller's deadline", err, time.Since(start))
				}
				if v := get(); v != "1" {
					t.Fatalf("late request applied before its delay: %q", v)
				}
				<-f.Done()
				if v := get(); v != "2" {
					t.Fatalf("late request not applied once delivered: %q", v)
				}
			}
			if err := put(context.Background(), "3"); err != nil || get() != "3" {
				t.Fatalf("after the fault: %v", err)
			}
			if seen != 3 {
				t.Fatalf("Observe saw %d transactions, want 3", seen)
			}
		})
	}
}
