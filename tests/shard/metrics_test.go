package shard_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/metrics"
	"github.com/holdfast/holdfast/shard"
)

// TestMetrics: holdfast_shards_owned follows the shards a member owns, and
// holdfast_shard_releases_total counts a move as "moved" and a leave as
// "leaving"; every series exists at 0 from the start.
func TestMetrics(t *testing.T) {
	st := etcdStore(t, 5*time.Second)
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	want := func(lines ...string) {
		t.Helper()
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if err = testutil.GatherAndCompare(reg, strings.NewReader(strings.Join(lines, "\n")+"\n"), "holdfast_shards_owned", "holdfast_shard_releases_total"); err == nil {
				return
			}
		}
		t.Error(err)
	}
	head := []string{
		"# HELP holdfast_shard_releases_total Shards this process stopped owning, by cause (moved, leaving, returned, lost).",
		"# TYPE holdfast_shard_releases_total counter",
	}
	owned := func(n string) []string {
		return []string{"# HELP holdfast_shards_owned Shards of shard groups this process owns now.", "# TYPE holdfast_shards_owned gauge", "holdfast_shards_owned " + n}
	}
	rel := func(moved, leaving string) []string {
		return append(append([]string(nil), head...),
			`holdfast_shard_releases_total{cause="leaving"} `+leaving,
			`holdfast_shard_releases_total{cause="lost"} 0`,
			`holdfast_shard_releases_total{cause="moved"} `+moved,
			`holdfast_shard_releases_total{cause="returned"} 0`)
	}
	want(append(rel("0", "0"), owned("0")...)...)

	name := uniq(t)
	s1, _, _ := st.join(t)
	g1, err := shard.New(s1, name, shard.Config{Shards: 4, Observer: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	work := func(ctx context.Context, _ shard.Shard, _ *etcd.Grant) { <-ctx.Done() }
	go func() { done1 <- g1.Run(ctx1, work) }()
	want(append(rel("0", "0"), owned("4")...)...)

	s2, _, _ := st.join(t)
	g2, _ := shard.New(s2, name, shard.Config{Shards: 4})
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- g2.Run(ctx2, work) }()
	want(append(rel("2", "0"), owned("2")...)...)

	cancel1()
	if err := <-done1; err != nil {
		t.Error(err)
	}
	want(append(rel("2", "2"), owned("0")...)...)
	cancel2()
	if err := <-done2; err != nil {
		t.Error(err)
	}
}
