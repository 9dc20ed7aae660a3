package embedtest

import (
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// TestConsulCluster: three servers elect a leader; killing it, the others
// elect another and keep accepting writes; the killed server comes back
// with its data. The same with the leader frozen (SIGSTOP) and thawed.
func TestConsulCluster(t *testing.T) {
	c := ConsulServers(t, 3)
	leader, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := c.NewClient(leader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.KV().Put(&api.KVPair{Key: "k", Value: []byte("v1")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	next, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("new leader %d (was %d) after %v", next, leader, time.Since(killed).Round(time.Millisecond))
	if next == leader {
		t.Fatalf("the killed server %d still leads", leader)
	}
	other, err := c.NewClient(next)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.KV().Put(&api.KVPair{Key: "k", Value: []byte("v2")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
	pair, _, err := cli.KV().Get("k", &api.QueryOptions{RequireConsistent: true})
	if err != nil || pair == nil || string(pair.Value) != "v2" {
		t.Fatalf("after the restart: %+v, %v; want v2", pair, err)
	}

	// Freeze the leader: the others elect another; thawed, the old leader
	// serves the newer value.
	if leader, err = c.WaitLeader(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Freeze(leader); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	for next = leader; next == leader; {
		if next, err = c.WaitLeader(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		if time.Since(frozen) > 30*time.Second {
			t.Fatalf("server %d still reported as leader 30 s after it was frozen", leader)
		}
	}
	t.Logf("leader %d frozen: new leader %d after %v", leader, next, time.Since(frozen).Round(time.Millisecond))
	if other, err = c.NewClient(next); err != nil {
		t.Fatal(err)
	}
	if _, err := other.KV().Put(&api.KVPair{Key: "k", Value: []byte("v3")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Thaw(leader); err != nil {
		t.Fatal(err)
	}
	if cli, err = c.NewClient(leader); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		pair, _, err = cli.KV().Get("k", &api.QueryOptions{RequireConsistent: true})
		if err == nil && pair != nil && string(pair.Value) == "v3" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thawed server: %+v, %v; want v3", pair, err)
		}
	}
}
