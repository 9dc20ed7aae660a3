package bench

import (
	"context"
	"io"
	"testing"
	"time"
)

// TestShardScenario: the quick shard row (16 shards x 4 members) on etcd
// balances, moves about 16/5 shards on a join and 16/4 on a leave (at most
// twice that), with no shard owned twice.
func TestShardScenario(t *testing.T) {
	target, err := StartEtcd()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := Run(ctx, target, ScenarioShard, Options{Quick: true, TTL: 2 * time.Second, Log: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Other) != 1 {
		t.Fatalf("%d rows, want 1", len(sum.Other))
	}
	r := sum.Other[0].(ShardResult)
	t.Logf("%+v", r)
	if r.Errors > 0 || r.Violations > 0 || r.JoinMoved < 16/5 || r.JoinMoved > 2*4 || r.LeaveMoved < 16/5 || r.LeaveMoved > 2*4 || r.ColdMs <= 0 {
		t.Errorf("row %+v", r)
	}
}
