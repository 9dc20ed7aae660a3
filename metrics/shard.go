package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/shard"
)

var _ shard.Observer = (*Metrics)(nil)

// Release causes of a shard (label cause of shard_releases_total): every
// series exists from New on.
var shardCauses = []string{"moved", "leaving", "returned", "lost"}

// shardMetrics are the series of shard groups: give the Metrics to
// shard.Config.Observer.
//
//	holdfast_shards_owned          gauge    shards this process owns now
//	holdfast_shard_releases_total  counter  shards this process stopped owning, by cause:
//	                                        moved (assigned to another member), leaving
//	                                        (Run's context ended), returned (work returned
//	                                        by itself), lost (the grant was lost)
//
// With Options.PerName both get a "name" label: the group's name.
type shardMetrics struct {
	owned    *prometheus.GaugeVec
	releases *prometheus.CounterVec
}

func newShardMetrics(ns string, name []string) shardMetrics {
	return shardMetrics{
		owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "shards_owned",
			Help: "Shards of shard groups this process owns now.",
		}, name),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "shard_releases_total",
			Help: "Shards this process stopped owning, by cause (moved, leaving, returned, lost).",
		}, append([]string{"cause"}, name...)),
	}
}

func (s shardMetrics) init(labels []string) {
	s.owned.WithLabelValues(labels...)
	for _, c := range shardCauses {
		s.releases.WithLabelValues(append([]string{c}, labels...)...)
	}
}

// ShardAcquired implements shard.Observer.
func (m *Metrics) ShardAcquired(group string, _ shard.Shard) {
	m.shard.owned.WithLabelValues(m.labels(group)...).Inc()
}

// ShardReleased implements shard.Observer.
func (m *Metrics) ShardReleased(group string, _ shard.Shard, cause error) {
	l := m.labels(group)
	m.shard.owned.WithLabelValues(l...).Dec()
	m.shard.releases.WithLabelValues(append([]string{shardCause(cause)}, l...)...).Inc()
}

// shardCause is the cause label of a shard's release.
func shardCause(err error) string {
	switch {
	case errors.Is(err, shard.ErrMoved):
		return "moved"
	case errors.Is(err, shard.ErrLeaving):
		return "leaving"
	case errors.Is(err, holdfast.ErrLost):
		return "lost"
	default:
		return "returned"
	}
}
