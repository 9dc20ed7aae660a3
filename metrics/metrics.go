// Package metrics exports holdfast's events as Prometheus metrics. Make a
// Metrics with New, register it with your registry, and give it to every
// session whose grants it should count, with the backend's WithObserver
// option:
//
//	m := metrics.New(metrics.Options{})
//	prometheus.MustRegister(m)
//	s, err := etcd.Dial(ctx, endpoints, etcd.WithObserver(m))
//
// The metrics (namespace "holdfast" unless Options.Namespace says
// otherwise):
//
//	holdfast_acquire_wait_seconds    histogram  time from Lock (TryLock, RLock, Campaign...) to the grant
//	holdfast_hold_seconds            histogram  time from the grant to its end (Unlock or loss)
//	holdfast_grants_lost_total       counter    grants lost (ended without Unlock or Close), by cause
//	holdfast_renewal_failures_total  counter    failed session renewals (each retried until the safe deadline)
//	holdfast_sessions_ended_total    counter    sessions that ended, by cause
//	holdfast_holders                 gauge      grants held now
//	holdfast_waiters                 gauge      acquisitions waiting now
//	holdfast_shards_owned            gauge      shards of shard groups owned now (shard.Config.Observer)
//	holdfast_shard_releases_total    counter    shards no longer owned, by cause: moved, leaving, returned, lost
//
// Label cause has a fixed set of values, and every series of a known cause
// exists at 0 from New on (from a name's first event with PerName), so that
// rate() and alerts work before the first event. Grants are lost with cause
// "lost" (the key was deleted or taken over, or a guarded write found it
// gone), "session_lost" (the session expired or was revoked, or its
// renewals stopped before the safe deadline) or "other"; a grant that
// Session.Close ends is released, not lost. Sessions end with cause
// "session_closed" (Session.Close), "session_lost" or "other". Lock names
// are user data, so by default no metric has a name label and the number
// of series is fixed; with Options.PerName, every metric but the session
// ones gets a "name" label, one series per lock name: use it only with a
// bounded set of names.
package metrics

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/holdfast/holdfast"
)

// Options configure New. The zero value is the default.
type Options struct {
	// Namespace prefixes every metric name (default "holdfast").
	Namespace string
	// PerName adds a "name" label (the lock, semaphore or election name)
	// to the grant and waiter metrics. Off by default: names are user
	// data, and each one makes new series.
	PerName bool
	// Buckets are the histograms' buckets, in seconds (default:
	// prometheus.ExponentialBuckets(0.001, 4, 10), 1 ms to about 4.4 min).
	Buckets []float64
}

// Metrics is a prometheus.Collector and a holdfast.Observer: register it,
// and give it to sessions with their WithObserver option. It is safe for
// concurrent use by any number of sessions.
type Metrics struct {
	perName    bool
	wait, hold *prometheus.HistogramVec
	lost       *prometheus.CounterVec
	renewals   prometheus.Counter
	sessions   *prometheus.CounterVec
	holders    *prometheus.GaugeVec
	waiters    *prometheus.GaugeVec
	shard      shardMetrics
	collectors []prometheus.Collector
	named      sync.Map // names whose series exist (PerName)
}

// Known causes: every series of these exists from the start.
var (
	lostCauses    = []string{"lost", "session_lost", "other"}
	sessionCauses = []string{"session_closed", "session_lost", "other"}
)

var (
	_ prometheus.Collector = (*Metrics)(nil)
	_ holdfast.Observer    = (*Metrics)(nil)
)

// New returns the metrics, unregistered.
func New(o Options) *Metrics {
	ns := o.Namespace
	if ns == "" {
		ns = "holdfast"
	}
	buckets := o.Buckets
	if len(buckets) == 0 {
		buckets = prometheus.ExponentialBuckets(0.001, 4, 10)
	}
	var name []string
	if o.PerName {
		name = []string{"name"}
	}
	m := &Metrics{
		perName: o.PerName,
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "acquire_wait_seconds", Buckets: buckets,
			Help: "Time from an acquisition's start (Lock, TryLock, RLock, Campaign...) to its grant.",
		}, name),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "hold_seconds", Buckets: buckets,
			Help: "Time from a grant to its end (Unlock or loss).",
		}, name),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "grants_lost_total",
			Help: "Grants lost (ended without Unlock or Close), by cause (lost, session_lost, other).",
		}, append([]string{"cause"}, name...)),
		renewals: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "renewal_failures_total",
			Help: "Failed session renewals (keepalives, session renews); each is retried until the safe deadline.",
		}),
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "sessions_ended_total",
			Help: "Sessions that ended, by cause (session_lost, session_closed, other).",
		}, []string{"cause"}),
		holders: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "holders",
			Help: "Grants held now.",
		}, name),
		waiters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "waiters",
			Help: "Acquisitions waiting now.",
		}, name),
	}
	m.shard = newShardMetrics(ns, name)
	m.collectors = []prometheus.Collector{m.wait, m.hold, m.lost, m.renewals, m.sessions, m.holders, m.waiters, m.shard.owned, m.shard.releases}
	for _, c := range sessionCauses {
		m.sessions.WithLabelValues(c)
	}
	if !m.perName {
		m.init(nil)
	}
	return m
}

// init makes the series of labels (a name's, or none) exist at 0.
func (m *Metrics) init(labels []string) {
	for _, c := range lostCauses {
		m.lost.WithLabelValues(append([]string{c}, labels...)...)
	}
	m.wait.WithLabelValues(labels...)
	m.hold.WithLabelValues(labels...)
	m.holders.WithLabelValues(labels...)
	m.waiters.WithLabelValues(labels...)
	m.shard.init(labels)
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors {
		c.Collect(ch)
	}
}

// labels returns the labels of name's series, making them exist at 0 on
// name's first event.
func (m *Metrics) labels(name string) []string {
	if !m.perName {
		return nil
	}
	l := []string{name}
	if _, seen := m.named.LoadOrStore(name, struct{}{}); !seen {
		m.init(l)
	}
	return l
}

// Waiting implements holdfast.Observer.
func (m *Metrics) Waiting(name string, delta int) {
	m.waiters.WithLabelValues(m.labels(name)...).Add(float64(delta))
}

// Acquired implements holdfast.Observer.
func (m *Metrics) Acquired(name string, _ holdfast.Token, wait time.Duration) {
	m.wait.WithLabelValues(m.labels(name)...).Observe(wait.Seconds())
	m.holders.WithLabelValues(m.labels(name)...).Inc()
}

// Ended implements holdfast.Observer.
func (m *Metrics) Ended(name string, _ holdfast.Token, held time.Duration, cause error) {
	m.hold.WithLabelValues(m.labels(name)...).Observe(held.Seconds())
	m.holders.WithLabelValues(m.labels(name)...).Dec()
	if !errors.Is(cause, holdfast.ErrReleased) { // a release, or a Close
		m.lost.WithLabelValues(append([]string{Cause(cause)}, m.labels(name)...)...).Inc()
	}
}

// RenewalFailed implements holdfast.Observer.
func (m *Metrics) RenewalFailed(error) { m.renewals.Inc() }

// SessionEnded implements holdfast.Observer.
func (m *Metrics) SessionEnded(cause error) { m.sessions.WithLabelValues(Cause(cause)).Inc() }

// Cause is the cause label of err: "session_closed", "session_lost",
// "lost" or "other".
func Cause(err error) string {
	switch {
	case errors.Is(err, holdfast.ErrSessionClosed):
		return "session_closed"
	case errors.Is(err, holdfast.ErrSessionLost):
		return "session_lost"
	case errors.Is(err, holdfast.ErrLost):
		return "lost"
	default:
		return "other"
	}
}
