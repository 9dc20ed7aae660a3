package metrics_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/embedtest/leakcheck"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/metrics"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// TestContendedRun scrapes the registry after a contended run on etcd and
// checks every metric against what the run did: 4 sessions take one lock
// 10 times each; then one holder's lease is revoked; one session's
// connection is frozen past a keepalive; the sessions are closed.
func TestContendedRun(t *testing.T) {
	c := etcdtest.Etcd(t)
	m := metrics.New(metrics.Options{PerName: true})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, _ := url.Parse(c.Endpoints()[0])
	proxy := embedtest.StartProxy(t, u.Host)
	var sessions []*etcd.Session
	for i := range 4 {
		ep := c.Endpoints()[0]
		if i == 0 {
			ep = proxy.URL()
		}
		s, err := etcd.Dial(ctx, []string{ep}, etcd.WithTTL(6*time.Second), etcd.WithObserver(m))
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, s)
	}
	const rounds = 10
	var wg sync.WaitGroup
	for _, s := range sessions {
		mu, err := etcd.NewMutex(s, "jobs/report")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				g, err := mu.Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Millisecond)
				if err := g.Unlock(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()

	// A holder loses its grant: its lease is revoked from outside.
	mu, _ := etcd.NewMutex(sessions[3], "jobs/other")
	g, err := mu.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if out := gather(t, reg); !strings.Contains(out, `holdfast_holders{name="jobs/other"} 1`) {
		t.Errorf("while held, the registry lacks holders 1:\n%s", out)
	}
	if _, err := c.Client(t).Revoke(ctx, sessions[3].Lease()); err != nil {
		t.Fatal(err)
	}
	<-g.Context().Done()
	// Session 0's keepalives (every 2 s, each attempt bounded by 2 s) are
	// frozen for 3 s, well within its safe deadline (4.8 s): at least one
	// renewal fails, and the session survives.
	proxy.Pause()
	time.Sleep(3 * time.Second)
	proxy.Mend()
	for _, s := range sessions {
		s.Close()
	}

	if n := testutil.CollectAndCount(m, "holdfast_acquire_wait_seconds"); n != 2 {
		t.Errorf("%d acquire-wait series, want 2 (one per name)", n)
	}
	out := gather(t, reg)
	for _, want := range []string{
		`holdfast_acquire_wait_seconds_count{name="jobs/report"} 40`,
		`holdfast_acquire_wait_seconds_count{name="jobs/other"} 1`,
		`holdfast_hold_seconds_count{name="jobs/report"} 40`,
		`holdfast_hold_seconds_count{name="jobs/other"} 1`,
		`holdfast_grants_lost_total{cause="lost",name="jobs/other"} 1`,
		`holdfast_sessions_ended_total{cause="session_closed"} 3`,
		`holdfast_sessions_ended_total{cause="session_lost"} 1`,
		`holdfast_holders{name="jobs/report"} 0`,
		`holdfast_holders{name="jobs/other"} 0`,
		`holdfast_waiters{name="jobs/report"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the registry lacks %s", want)
		}
	}
	if strings.Contains(out, "holdfast_renewal_failures_total 0\n") || !strings.Contains(out, "holdfast_renewal_failures_total") {
		t.Errorf("no renewal failure counted after a frozen keepalive")
	}
	t.Logf("registry after the run:\n%s", out)
}

// gather renders the registry's metrics in the text format, sorted.
func gather(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, mt := range mf.Metric {
			var labels []string
			for _, l := range mt.Label {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			lbl := ""
			if len(labels) > 0 {
				lbl = "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case mt.Histogram != nil:
				b.WriteString(mf.GetName() + "_count" + lbl + " " + itoa(mt.Histogram.GetSampleCount()) + "\n")
			case mt.Counter != nil:
				b.WriteString(mf.GetName() + lbl + " " + ftoa(mt.Counter.GetValue()) + "\n")
			case mt.Gauge != nil:
				b.WriteString(mf.GetName() + lbl + " " + ftoa(mt.Gauge.GetValue()) + "\n")
			}
		}
	}
	return b.String()
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// TestNoNameLabelByDefault: without PerName, the series do not depend on
// lock names.
func TestNoNameLabelByDefault(t *testing.T) {
	a := embedtest.Consul(t)
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := consul.NewSession(ctx, a.Client(t), consul.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		mu, err := consul.NewMutex(s, name)
		if err != nil {
			t.Fatal(err)
		}
		g, err := mu.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	out := gather(t, reg)
	if strings.Contains(out, "name=") {
		t.Errorf("a name label without PerName:\n%s", out)
	}
	if !strings.Contains(out, "holdfast_acquire_wait_seconds_count 3") || !strings.Contains(out, `holdfast_sessions_ended_total{cause="session_closed"} 1`) {
		t.Errorf("registry:\n%s", out)
	}
}

// TestLogger: WithLogger logs a grant, its release, a loss with its cause,
// and the session's end; nothing without it.
func TestLogger(t *testing.T) {
	c := etcdtest.Etcd(t)
	var buf syncBuffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := etcd.Dial(ctx, c.Endpoints(), etcd.WithLogger(l))
	if err != nil {
		t.Fatal(err)
	}
	mu, _ := etcd.NewMutex(s, "logged")
	g, err := mu.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g, err = mu.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client(t).Delete(ctx, g.Key()); err != nil {
		t.Fatal(err)
	}
	<-g.Context().Done()
	s.Close()
	out := buf.String()
	for _, want := range []string{
		`level=INFO msg="holdfast: granted" store=etcd lease=`, `name=logged token=`,
		`level=DEBUG msg="holdfast: released"`,
		`level=WARN msg="holdfast: lost"`, `cause="holdfast: grant lost`,
		`level=INFO msg="holdfast: session ended"`, `session closed`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %s:\n%s", want, out)
		}
	}
	// Quiet by default: a session without WithLogger logs nothing, even
	// through the default logger.
	var def syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&def, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer slog.SetDefault(old)
	s2, err := etcd.Dial(ctx, c.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	mu2, _ := etcd.NewMutex(s2, "quiet")
	if g, err := mu2.Lock(ctx); err == nil {
		_ = g.Unlock(ctx)
	}
	s2.Close()
	if def.String() != "" {
		t.Errorf("a session without WithLogger logged:\n%s", def.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var _ holdfast.Observer = (*metrics.Metrics)(nil)

// TestSeriesExistAtZero: every counter series of a known cause exists at 0
// before any event (so that rate() and alerts work from the start); with
// PerName, from a name's first event.
func TestSeriesExistAtZero(t *testing.T) {
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	out := gather(t, reg)
	for _, want := range []string{
		`holdfast_grants_lost_total{cause="lost"} 0`,
		`holdfast_grants_lost_total{cause="session_lost"} 0`,
		`holdfast_grants_lost_total{cause="other"} 0`,
		`holdfast_sessions_ended_total{cause="session_closed"} 0`,
		`holdfast_sessions_ended_total{cause="session_lost"} 0`,
		`holdfast_sessions_ended_total{cause="other"} 0`,
		`holdfast_renewal_failures_total 0`,
		`holdfast_holders 0`,
		`holdfast_waiters 0`,
		`holdfast_acquire_wait_seconds_count 0`,
		`holdfast_hold_seconds_count 0`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("a new registry lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, `grants_lost_total{cause="session_closed"}`) {
		t.Errorf("a grant ended by Close is not lost, yet the series exists:\n%s", out)
	}

	m = metrics.New(metrics.Options{PerName: true})
	reg = prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	if out := gather(t, reg); strings.Contains(out, "name=") {
		t.Errorf("a per-name series before any name was seen:\n%s", out)
	}
	m.Waiting("jobs/a", 1)
	m.Waiting("jobs/a", -1)
	out = gather(t, reg)
	for _, c := range []string{"lost", "session_lost", "other"} {
		if want := `holdfast_grants_lost_total{cause="` + c + `",name="jobs/a"} 0`; !strings.Contains(out, want+"\n") {
			t.Errorf("after jobs/a's first event, the registry lacks %s:\n%s", want, out)
		}
	}
}

// TestCloseIsNotALoss: a session closed while it holds a grant counts and
// logs no loss on either store: the grant is released by Close, the session
// ends with cause "holdfast: session closed"; the grant's context still
// says ErrLost and ErrSessionClosed to the holder's code.
func TestCloseIsNotALoss(t *testing.T) {
	for _, store := range []string{"etcd", "consul"} {
		t.Run(store, func(t *testing.T) {
			m := metrics.New(metrics.Options{})
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(m)
			var buf syncBuffer
			l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var (
				g     holdfast.Grant
				close func() error
			)
			switch store {
			case "etcd":
				c := etcdtest.Etcd(t)
				s, err := etcd.Dial(ctx, c.Endpoints(), etcd.WithLogger(l), etcd.WithObserver(m))
				if err != nil {
					t.Fatal(err)
				}
				mu, _ := etcd.NewMutex(s, "closed")
				if g, err = mu.Lock(ctx); err != nil {
					t.Fatal(err)
				}
				close = s.Close
			case "consul":
				a := embedtest.Consul(t)
				s, err := consul.NewSession(ctx, a.Client(t), consul.WithLogger(l), consul.WithObserver(m))
				if err != nil {
					t.Fatal(err)
				}
				mu, _ := consul.NewMutex(s, "closed")
				if g, err = mu.Lock(ctx); err != nil {
					t.Fatal(err)
				}
				close = s.Close
			}
			if err := close(); err != nil {
				t.Fatal(err)
			}
			if cause := context.Cause(g.Context()); !errors.Is(cause, holdfast.ErrLost) || !errors.Is(cause, holdfast.ErrSessionClosed) {
				t.Errorf("the grant's context cause after Close: %v, want ErrLost and ErrSessionClosed", cause)
			}
			out := gather(t, reg)
			for _, want := range []string{
				`holdfast_grants_lost_total{cause="lost"} 0`,
				`holdfast_grants_lost_total{cause="session_lost"} 0`,
				`holdfast_grants_lost_total{cause="other"} 0`,
				`holdfast_sessions_ended_total{cause="session_closed"} 1`,
				`holdfast_hold_seconds_count 1`,
				`holdfast_holders 0`,
			} {
				if !strings.Contains(out, want+"\n") {
					t.Errorf("after Close, the registry lacks %s:\n%s", want, out)
				}
			}
			if strings.Contains(out, `grants_lost_total{cause="session_closed"}`) {
				t.Errorf("a grant ended by Close counted as lost:\n%s", out)
			}
			log := buf.String()
			if strings.Contains(log, "level=WARN") || strings.Contains(log, "grant lost") {
				t.Errorf("Close logged a loss:\n%s", log)
			}
			for _, want := range []string{
				`level=DEBUG msg="holdfast: released"`,
				`level=INFO msg="holdfast: session ended"`, `cause="holdfast: session closed"`,
			} {
				if !strings.Contains(log, want) {
					t.Errorf("the log lacks %s:\n%s", want, log)
				}
			}
		})
	}
}
