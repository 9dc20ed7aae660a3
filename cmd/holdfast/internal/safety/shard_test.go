package safety

import (
	"context"
	"os"
	"testing"
	"time"
)

// shardDuration is how long each short shard scenario runs: 3 s, or
// HOLDFAST_SAFETY_DURATION if set ("holdfast soak --primitive shard" runs
// it for as long as asked).
func shardDuration(t *testing.T) time.Duration {
	if os.Getenv("HOLDFAST_SAFETY_DURATION") != "" {
		return duration(t)
	}
	return 3 * time.Second
}

// TestShardUnderFaults runs the shard scenario briefly on both stores,
// at once: on etcd with the member faults (kill, pause, restart), on
// Consul with graceful restarts only (a killed or paused member's session
// takes up to 20 s to expire there, and the scenario waits for it before
// it counts the keys left). Every checker must pass on every shard, and
// there must be at least as many grants as shards.
func TestShardUnderFaults(t *testing.T) {
	t.Run("etcd", func(t *testing.T) {
		t.Parallel()
		s, err := RunEtcd(context.Background(), EtcdOptions{Duration: shardDuration(t), Primitive: Shard, Faults: ShardMemberFaults, Log: testLog{t}})
		check(t, s, err)
		checkShards(t, s)
	})
	t.Run("consul", func(t *testing.T) {
		t.Parallel()
		s, err := RunConsul(context.Background(), ConsulOptions{Duration: shardDuration(t), Primitive: Shard, Faults: []string{"restart-member"}, Log: testLog{t}})
		check(t, s, err)
		checkShards(t, s)
	})
}

func checkShards(t *testing.T, s Summary) {
	t.Helper()
	if s.Shards != ShardCount || s.Grants < ShardCount || s.GrantsChecked != s.Grants {
		t.Errorf("shards %d, grants %d (checked %d): want %d shards, at least as many grants, every grant checked", s.Shards, s.Grants, s.GrantsChecked, ShardCount)
	}
}
