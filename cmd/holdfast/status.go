package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast"
	hfconsul "github.com/holdfast/holdfast/consul"
	hfetcd "github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/internal/tlsfiles"
)

var statusCommand = &command{
	name:    "status",
	summary: "show who holds and who waits for a lock, a semaphore, a read-write lock or an election",
	usage: `usage: holdfast status [flags] NAME

Shows what the store holds of NAME, read without writing anything: its kind
(lock, semaphore with its limit, rwmutex, election, claim with the last
period claimed and its token; none when no key is there), the holders and the waiters in the order the store serves them, with
their fencing tokens, modes (read, write), sessions (etcd: lease ID, TTL and
time left; Consul: session ID, TTL and lock-delay), values as their clients
wrote them (an election's proposals), and whether holdfast or a native client
(etcdctl lock/elect, concurrency.Mutex, consul lock [-n], api.Lock,
api.Semaphore) wrote each key: "unknown" where both write the same (an
election's leader). holdfast's own bookkeeping keys and values are not shown.
For a shard group (holdfast shard, package shard) it shows the members, and
per shard its owner, token and waiters.

A lock's and an election's keys have the same layout: status reads keys with
values as an election's; --kind lock or --kind election says which to show.
--json prints one JSON object per state; --watch prints the state again each
time the keys under NAME change (in place on a terminal), until interrupted.

--timeout bounds connecting and each read (default ` + statusTimeout.String() + `): a store that
does not answer within it, or refuses the connection, ends status with 125.
--watch checks every --timeout that the store still answers: one that went
silent ends it with 125 within twice --timeout.

Exit status:
  0               the state was shown; --watch was interrupted
  2               a usage or input error, found before any request: a bad
                  flag or argument, a missing or invalid NAME
  125             the store was unreachable or silent within --timeout, or
                  refused (permission)`,
	flags: statusFlags,
}

func statusFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	sf := addConnFlags(fs)
	kind := fs.String("kind", "auto", "auto, lock or election: how to show a lock's or an election's keys")
	jsonOut := fs.Bool("json", false, "print JSON, one object per state")
	watch := fs.Bool("watch", false, "print the state again on every change, until interrupted")
	timeout := fs.Duration("timeout", statusTimeout, "bound on connecting and on each read: a store silent for this long ends status with 125")
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) != 1 {
			return usagef("want exactly one NAME")
		}
		name := args[0]
		if err := holdfast.ValidateName(name); err != nil {
			return usagef("%v", err)
		}
		switch *kind {
		case "auto", "lock", "election":
		default:
			return usagef("--kind %q: want auto, lock or election", *kind)
		}
		if *timeout <= 0 {
			return usagef("--timeout %v: want a positive duration", *timeout)
		}
		r, err := sf.reader(ctx, *timeout)
		if err != nil {
			return err
		}
		defer r.close()
		p := printer{w: e.stdout, json: *jsonOut, clear: *watch && isTerminal(e.stdout)}
		for {
			st, err := readBounded(ctx, r, name, *timeout)
			if err != nil {
				if ctx.Err() != nil && *watch {
					return nil
				}
				return explain(err, name, sf.describe())
			}
			if k := holdfast.Kind(*kind); k != "auto" && (st.Kind == holdfast.KindLock || st.Kind == holdfast.KindElection) {
				st.Kind = k
			}
			shown, err := printShardGroup(ctx, r, e.stdout, *sf.backend, st, *jsonOut)
			if err != nil {
				return explain(err, name, sf.describe())
			}
			if !shown {
				if err := p.print(newView(*sf.backend, st)); err != nil {
					return err
				}
			}
			if !*watch {
				return nil
			}
			if err := r.wait(ctx, name, st.Index); err != nil {
				if ctx.Err() != nil {
					return nil // interrupted
				}
				return exitError{exitFailed, explainf(err, "%s: %s: %v", name, sf.describe(), err)}
			}
		}
	}
}

// errSilent is the cause of a read that ran out of its --timeout: a
// failure (125), unlike lock's errTimeout (124).
var errSilent = errors.New("no answer")

// statusTimeout is status's default --timeout (etcdctl's command timeout).
const statusTimeout = 5 * time.Second

// readBounded reads name's state through r within timeout: a store that
// does not answer in time is a failure (125) that says so.
func readBounded(ctx context.Context, r reader, name string, timeout time.Duration) (*holdfast.State, error) {
	rctx, cancel := context.WithTimeoutCause(ctx, timeout, errSilent)
	defer cancel()
	st, err := r.read(rctx, name)
	if err != nil && errors.Is(context.Cause(rctx), errSilent) && ctx.Err() == nil {
		return nil, fmt.Errorf("did not answer within %v: %w", timeout, err)
	}
	return st, err
}

// view is what status prints of a state (the JSON of --json).
type view struct {
	Backend string          `json:"backend"`
	Name    string          `json:"name"`
	Kind    string          `json:"kind"`            // lock, semaphore, rwmutex, election, claim, or none
	Limit   int             `json:"limit,omitempty"` // a semaphore's
	Index   uint64          `json:"index"`
	Holders []contenderView `json:"holders"`
	Waiters []contenderView `json:"waiters"`
	// Other lists keys under NAME/ that are no contender's (a longer
	// name's, or a conflicting primitive's).
	Other []string `json:"other,omitempty"`
	// Period and PeriodToken are a claim's last period claimed (RFC 3339)
	// and its token; its holder, if any, is that period's run.
	Period      string `json:"period,omitempty"`
	PeriodToken uint64 `json:"period_token,omitempty"`
}

// contenderView is one holder or waiter.
type contenderView struct {
	Role      string `json:"role"` // holder, waiter; leader, candidate
	Key       string `json:"key"`
	Token     uint64 `json:"token,omitempty"` // a holder's fencing token
	Mode      string `json:"mode,omitempty"`  // read or write
	Session   string `json:"session"`
	TTL       string `json:"ttl,omitempty"`
	Left      string `json:"left,omitempty"` // etcd: time left on the lease
	LockDelay string `json:"lock_delay,omitempty"`
	Value     string `json:"value,omitempty"`
	Origin    string `json:"origin"` // holdfast, native or unknown
}

func newView(backend string, st *holdfast.State) view {
	v := view{Backend: backend, Name: st.Name, Kind: string(st.Kind), Limit: st.Limit, Index: st.Index, Other: st.Other,
		Holders: []contenderView{}, Waiters: []contenderView{}}
	if st.Kind == holdfast.KindUnknown {
		v.Kind = "none"
	}
	holder, waiter := "holder", "waiter"
	if st.Kind == holdfast.KindElection {
		holder, waiter = "leader", "candidate"
	}
	if st.Kind == holdfast.KindClaim {
		holder = "run"
		if !st.Period.IsZero() {
			v.Period, v.PeriodToken = st.Period.Format(time.RFC3339Nano), uint64(st.PeriodToken)
		}
	}
	conv := func(role string, c holdfast.Contender) contenderView {
		cv := contenderView{Role: role, Key: c.Key, Token: uint64(c.Token), Mode: c.Mode, Session: c.Session, Value: string(c.Value), Origin: string(c.Origin)}
		if c.TTL > 0 {
			cv.TTL = c.TTL.String()
		}
		if c.Left >= 0 {
			cv.Left = c.Left.String()
		}
		if backend == "consul" {
			cv.LockDelay = c.LockDelay.String()
		}
		if c.Origin == holdfast.OriginUnknown {
			cv.Origin = "unknown"
		}
		return cv
	}
	for _, c := range st.Holders {
		v.Holders = append(v.Holders, conv(holder, c))
	}
	for _, c := range st.Waiters {
		v.Waiters = append(v.Waiters, conv(waiter, c))
	}
	return v
}

// reader reads a name's state from one store.
type reader interface {
	read(ctx context.Context, name string) (*holdfast.State, error)
	// wait returns once the keys under name changed after index.
	wait(ctx context.Context, name string, index uint64) error
	close()
}

// reader opens a read-only client on the store the flags name, with the
// same TLS and authentication settings as the commands' sessions; timeout
// bounds etcd's authentication.
func (f *storeFlags) reader(ctx context.Context, timeout time.Duration) (reader, error) {
	if err := f.otherStoreAddress(ctx); err != nil {
		return nil, err
	}
	switch *f.backend {
	case "etcd":
		eps, err := endpointList("--endpoints", *f.endpoints)
		if err != nil {
			return nil, err
		}
		sec, err := f.secure()
		if err != nil {
			return nil, err
		}
		cfg := clientv3.Config{
			Endpoints:   eps,
			DialTimeout: timeout,
			Logger:      zap.NewNop(),
			Context:     ctx,
			Username:    sec.user,
			Password:    sec.password.Reveal(),
		}
		if sec.tls() {
			if cfg.TLS, err = tlsfiles.Load(sec.cacert, sec.cert, sec.key); err != nil {
				return nil, exitError{exitFailed, err}
			}
			for _, ep := range eps {
				if strings.HasPrefix(strings.ToLower(ep), "http://") {
					return nil, exitError{exitFailed, fmt.Errorf("endpoint %s is plain http, but TLS is configured: use https:// or host:port", ep)}
				}
			}
		}
		c, err := clientv3.New(cfg)
		if err != nil {
			return nil, exitError{exitFailed, fmt.Errorf("%s: %w%s", f.describe(), err, diagnose(eps, cfg.TLS, err, probeTime))}
		}
		return etcdReader{c: c, tls: cfg.TLS, timeout: timeout}, nil
	case "consul":
		sec, err := f.secure()
		if err != nil {
			return nil, err
		}
		cfg := api.DefaultConfig()
		cfg.Address = *f.addr
		if !sec.token.Empty() {
			cfg.Token, cfg.TokenFile = sec.token.Reveal(), ""
		}
		if sec.tls() {
			if strings.HasPrefix(strings.ToLower(cfg.Address), "http://") {
				return nil, exitError{exitFailed, fmt.Errorf("address %s is plain http, but TLS is configured: use https:// or host:port", redact(cfg.Address))}
			}
			cfg.Scheme = "https"
			cfg.TLSConfig = api.TLSConfig{CAFile: sec.cacert, CertFile: sec.cert, KeyFile: sec.key}
		}
		c, err := api.NewClient(cfg)
		if err != nil {
			return nil, exitError{exitFailed, fmt.Errorf("%s: %w", f.describe(), err)}
		}
		return consulReader{c: c, timeout: timeout}, nil
	default:
		return nil, usagef("--backend %q: want etcd or consul", *f.backend)
	}
}

type etcdReader struct {
	c       *clientv3.Client
	tls     *tls.Config   // for a diagnosis
	timeout time.Duration // --timeout: see wait
}

func (r etcdReader) close() { r.c.Close() }

func (r etcdReader) read(ctx context.Context, name string) (*holdfast.State, error) {
	// The diagnosis of a read that times out is made within ctx's bound:
	// its probes start probeTime before the deadline, while the read
	// still waits (and are not made at all if the read is answered).
	var diag chan string
	if dl, ok := ctx.Deadline(); ok {
		probe := min(probeTime, time.Until(dl)/4)
		diag = make(chan string, 1)
		t := time.AfterFunc(time.Until(dl)-probe, func() { diag <- diagnose(r.c.Endpoints(), r.tls, context.DeadlineExceeded, probe) })
		defer t.Stop()
	}
	var st *holdfast.State
	err := failFastRefused(ctx, r.c.Endpoints(), func(ctx context.Context) (err error) {
		st, err = hfetcd.Inspect(ctx, r.c, name)
		return err
	})
	if err != nil {
		d := ""
		if errors.Is(err, context.DeadlineExceeded) && diag != nil {
			t := time.NewTimer(20 * time.Millisecond) // the probes end with the bound
			select {
			case d = <-diag:
			case <-t.C:
			}
			t.Stop()
		}
		return nil, fmt.Errorf("%w%s", err, d)
	}
	return st, nil
}

// probeTime bounds diagnose's probe of each endpoint.
const probeTime = 500 * time.Millisecond

// diagnose says why etcd could not be reached in time (its client waits
// for a connection until the deadline), from one TLS or TCP probe of each
// endpoint, each bounded by probe (the endpoints are probed at once): ""
// if the error is another, or if an endpoint looks fine.
func diagnose(endpoints []string, tlsCfg *tls.Config, err error, probe time.Duration) string {
	if !errors.Is(err, context.DeadlineExceeded) {
		return ""
	}
	results := make([]error, len(endpoints))
	var wg sync.WaitGroup
	for i, ep := range endpoints {
		wg.Go(func() { results[i] = probeEndpoint(ep, tlsCfg, probe) })
	}
	wg.Wait()
	var errs []string
	for _, err := range results {
		if err == nil {
			return ""
		}
		errs = append(errs, err.Error())
	}
	return "; " + strings.Join(errs, "; ")
}

// probeEndpoint is one of diagnose's probes.
func probeEndpoint(ep string, tlsCfg *tls.Config, probe time.Duration) error {
	host, cfg := ep, tlsCfg
	if u, err := url.Parse(ep); err == nil && u.Host != "" {
		host = u.Host
		if cfg == nil && u.Scheme == "https" {
			cfg = &tls.Config{} // the system's roots
		}
	}
	return tlsfiles.Probe(host, cfg, probe)
}

// wait returns once the keys under name changed after index. A watch on
// a link that went silent waits for ever, so every --timeout it also
// reads the keys' count, bounded by --timeout: a store silent for that
// long ends the wait with an error, within twice --timeout.
func (r etcdReader) wait(ctx context.Context, name string, index uint64) error {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := r.c.Watch(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithRev(int64(index)+1))
	tick := time.NewTicker(r.timeout)
	defer tick.Stop()
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				if err := ctx.Err(); err != nil {
					return err
				}
				return errors.New("etcd: watch ended")
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("etcd: watch %s/: %w", name, err)
			}
			if len(wr.Events) > 0 {
				return nil
			}
		case <-tick.C:
			pctx, pcancel := context.WithTimeout(ctx, r.timeout)
			_, err := r.c.Get(pctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			pcancel()
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("did not answer within %v while watching: %w", r.timeout, err)
			}
		}
	}
}

type consulReader struct {
	c       *api.Client
	timeout time.Duration // --timeout: see wait
}

func (r consulReader) close() {}

func (r consulReader) read(ctx context.Context, name string) (*holdfast.State, error) {
	return hfconsul.Inspect(ctx, r.c, name)
}

// wait returns once the keys under name changed after index: a blocking
// query, renewed every --timeout, and bounded by that wait (plus the
// agent's jitter, 1/16 of it) and --timeout: a store silent that long ends
// the wait with an error, within twice --timeout and a bit.
func (r consulReader) wait(ctx context.Context, name string, index uint64) error {
	wait := r.timeout
	for {
		qctx, cancel := context.WithTimeout(ctx, wait+wait/16+r.timeout)
		q := (&api.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(qctx)
		_, meta, err := r.c.KV().Keys(name+"/", "", q)
		silent := qctx.Err() != nil && ctx.Err() == nil
		cancel()
		if silent {
			return fmt.Errorf("did not answer within %v while watching: %w", r.timeout, err)
		}
		if err != nil {
			return fmt.Errorf("consul: watch %s/: %w", name, err)
		}
		if meta.LastIndex != index {
			return nil
		}
	}
}

// printer prints states as a table or as JSON lines.
type printer struct {
	w     io.Writer
	json  bool
	clear bool // redraw in place (a terminal in --watch mode)
}

func (p printer) print(v view) error {
	if p.json {
		return json.NewEncoder(p.w).Encode(v)
	}
	if p.clear {
		fmt.Fprint(p.w, "\x1b[H\x1b[2J")
	}
	kind := v.Kind
	if v.Limit > 0 {
		kind = fmt.Sprintf("%s (limit %d)", kind, v.Limit)
	}
	if v.Kind == "none" {
		kind = "name" // no key says what it is
	}
	fmt.Fprintf(p.w, "%s %s %q at index %d: ", v.Backend, kind, v.Name, v.Index)
	if v.Period != "" {
		fmt.Fprintf(p.w, "period %s claimed, token %d; ", v.Period, v.PeriodToken)
	}
	all := append(append([]contenderView{}, v.Holders...), v.Waiters...)
	if len(all) == 0 && v.Kind == string(holdfast.KindClaim) {
		fmt.Fprintln(p.w, "no run holds")
	} else if len(all) == 0 {
		fmt.Fprintln(p.w, "free, nobody waits")
	} else {
		fmt.Fprintf(p.w, "%d holder(s), %d waiter(s)\n", len(v.Holders), len(v.Waiters))
		tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ROLE\t#\tTOKEN\tORIGIN\tSESSION\tTTL\tKEY\tVALUE")
		for i, c := range all {
			tok := "-"
			if c.Token != 0 {
				tok = strconv.FormatUint(c.Token, 10)
			}
			role := c.Role
			if c.Mode != "" {
				role += " (" + c.Mode + ")"
			}
			ttl := c.TTL
			if c.Left != "" {
				ttl = c.Left + " left of " + c.TTL
			}
			if c.LockDelay != "" {
				ttl += ", lock-delay " + c.LockDelay
			}
			val := "-"
			if c.Value != "" {
				val = strconv.Quote(c.Value)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", role, i, tok, c.Origin, c.Session, ttl, c.Key, val)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, k := range v.Other {
		fmt.Fprintf(p.w, "other key under %s/: %s\n", v.Name, k)
	}
	return nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
