package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/holdfast/holdfast"
	hfconsul "github.com/holdfast/holdfast/consul"
	hfetcd "github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/metrics"
)

// visibility is what lock and elect show of their work: -v lines on
// stderr, the library's slog events, Prometheus metrics.
type visibility struct {
	verbose     *bool
	metricsAddr *string
	logFormat   *string
}

func addVisibilityFlags(fs *flag.FlagSet) *visibility {
	return &visibility{
		verbose:     fs.Bool("v", false, "say on stderr what happens: waiting behind N, acquired (token), lost and why, released"),
		metricsAddr: fs.String("metrics-addr", "", "serve Prometheus metrics (package metrics: waits, holds, losses, renewal failures) on http://`HOST:PORT`/metrics while holdfast runs"),
		logFormat:   fs.String("log", "", "log the sessions' events (grants, releases, losses, renewal failures) to stderr with log/slog: text or json"),
	}
}

// start checks the flags, gives the sessions sf opens the observers they
// ask for, and starts the metrics server; stop ends it. Errors are usage
// errors: they are found before any request.
func (v *visibility) start(e *env, sf *storeFlags) (stop func(), err error) {
	switch *v.logFormat {
	case "":
	case "text":
		sf.logger = slog.New(slog.NewTextHandler(e.stderr, nil))
	case "json":
		sf.logger = slog.New(slog.NewJSONHandler(e.stderr, nil))
	default:
		return nil, usagef("--log %q: want text or json", *v.logFormat)
	}
	if *v.metricsAddr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", *v.metricsAddr)
	if err != nil {
		return nil, usagef("--metrics-addr %s: %v", *v.metricsAddr, err)
	}
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	sf.observers = append(sf.observers, m)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	if *v.verbose {
		fmt.Fprintf(e.stderr, "holdfast: metrics on http://%s/metrics\n", ln.Addr())
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// positionDelay is how long an acquisition runs before -v says where it
// waits: one that is granted at once says nothing of waiting.
const positionDelay = 200 * time.Millisecond

// waitNames is the names an acquisition of name waits for, in the order
// it takes them: name alone, or with lock --and every name, sorted.
func (r runner) waitNames(name string) []string {
	if len(r.also) == 0 {
		return []string{name}
	}
	names := slices.Sorted(slices.Values(append([]string{name}, r.also...)))
	return slices.Compact(names)
}

// reportPosition prints, once, how many holders and waiters are ahead of
// this session on the first of names (taken in that order) that it does
// not hold yet, unless ctx ends first.
func (r runner) reportPosition(ctx context.Context, s *session, names []string) {
	t := time.NewTimer(positionDelay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	var held []string
	for _, name := range names {
		var st *holdfast.State
		var err error
		var me string
		if s.etcd != nil {
			st, err = hfetcd.Inspect(ctx, s.etcd.Client(), name)
			me = fmt.Sprintf("%x", int64(s.etcd.Lease()))
		} else {
			st, err = hfconsul.Inspect(ctx, s.consul.Client(), name)
			me = s.consul.ID()
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			fmt.Fprintf(r.e.stderr, "holdfast: %s: waiting (the queue could not be read: %v)\n", name, err)
			return
		}
		if slices.ContainsFunc(st.Holders, func(c holdfast.Contender) bool { return c.Session == me }) {
			held = append(held, name)
			continue
		}
		ahead := len(st.Holders)
		for _, w := range st.Waiters {
			if w.Session == me {
				break
			}
			ahead++
		}
		also := ""
		if len(held) > 0 {
			also = "; holding " + strings.Join(held, ", ")
		}
		fmt.Fprintf(r.e.stderr, "holdfast: %s: waiting behind %d (%d holding, %d waiting ahead%s)\n", name, ahead, len(st.Holders), ahead-len(st.Holders), also)
		return
	}
}

// verbosef prints a -v line.
func (r runner) verbosef(format string, args ...any) {
	if r.verbose {
		fmt.Fprintf(r.e.stderr, "holdfast: "+format+"\n", args...)
	}
}
