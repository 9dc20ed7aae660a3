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
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast"
	hfconsul "github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/internal/tlsfiles"
)

var statusCommand = &command{
	name:    "status",
	summary: "show who holds and who waits for a lock, a semaphore or an election",
	usage: `usage: holdfast status [flags] NAME

Shows the holder(s) and the waiters of NAME in queue order, with their
fencing tokens, their sessions (etcd: lease ID and remaining TTL; Consul:
session ID, TTL and lock-delay) and values, read from the store without
writing anything. Native clients on the same name (etcdctl lock/elect,
concurrency.Mutex/Election, consul lock, api.Lock) show up like holdfast's.

Semaphores (holdfast's on etcd; api.Semaphore's layout on Consul, which
"consul lock -n N" and holdfast share) are recognised from their keys and
show their limit and every holder. For the rest, --kind says how to read the
keys: lock (holder, waiters) or election (leader, candidates); auto guesses
election when the keys carry values that holdfast's locks do not write. --json prints one JSON object per state;
--watch prints the state again each time the keys under NAME change (in place
on a terminal), until interrupted.`,
	flags: statusFlags,
}

func statusFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	sf := addStoreFlags(fs)
	kind := fs.String("kind", "auto", "auto, lock or election")
	jsonOut := fs.Bool("json", false, "print JSON, one object per state")
	watch := fs.Bool("watch", false, "print the state again on every change, until interrupted")
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
		if *sf.ttl != 0 || *sf.lockDelay >= 0 {
			return usagef("--ttl and --lock-delay do not apply to status (it opens no session)")
		}
		r, err := sf.reader(ctx)
		if err != nil {
			return err
		}
		defer r.close()
		p := printer{w: e.stdout, json: *jsonOut, clear: *watch && isTerminal(e.stdout)}
		var after uint64
		for {
			st, err := r.read(ctx, name)
			if err != nil {
				if ctx.Err() != nil && *watch {
					return nil
				}
				return err
			}
			st.classify(*kind)
			if err := p.print(st); err != nil {
				return err
			}
			if !*watch {
				return nil
			}
			after = st.Index
			if err := r.wait(ctx, name, after); err != nil {
				if ctx.Err() != nil {
					return nil // interrupted
				}
				return err
			}
		}
	}
}

// state is what status shows of a name.
type state struct {
	Backend string  `json:"backend"`
	Name    string  `json:"name"`
	Kind    string  `json:"kind"`            // lock, election or semaphore
	Limit   int     `json:"limit,omitempty"` // a semaphore's
	Index   uint64  `json:"index"`
	Entries []entry `json:"entries"`
	// Other lists keys under NAME/ that are no contender's (a longer name's).
	Other []string `json:"other,omitempty"`
}

// entry is one contender.
type entry struct {
	Role     string `json:"role"` // holder, waiter, leader, candidate
	Position int    `json:"position"`
	Key      string `json:"key"`
	Token    uint64 `json:"token,omitempty"` // the holder's fencing token
	Session  string `json:"session"`
	// TTLLeft is the lease's remaining TTL in seconds (etcd).
	TTLLeft *int64 `json:"ttl_left_s,omitempty"`
	// TTL and LockDelay describe the session (Consul).
	TTL       string `json:"ttl,omitempty"`
	LockDelay string `json:"lock_delay,omitempty"`
	Value     string `json:"value,omitempty"`
	// Native: the holder is not holdfast (Consul: the lock key's value is not
	// one holdfast writes).
	Native bool `json:"native,omitempty"`
}

// classify names the roles for kind (auto: election if a contender's value
// is one no lock of holdfast writes).
func (st *state) classify(kind string) {
	if st.Kind == "semaphore" {
		return // read as one from its keys
	}
	if kind == "auto" {
		kind = "lock"
		for _, e := range st.Entries {
			if e.Value != "" && !strings.HasPrefix(e.Value, "holdfast") {
				kind = "election"
			}
		}
	}
	st.Kind = kind
	for i := range st.Entries {
		e := &st.Entries[i]
		if kind == "election" {
			e.Native = false // any value is a candidate's proposal
		}
		switch {
		case kind == "election" && e.Role == "holder":
			e.Role = "leader"
		case kind == "election":
			e.Role = "candidate"
		}
	}
}

// reader reads a name's state from one store.
type reader interface {
	read(ctx context.Context, name string) (*state, error)
	// wait returns once the keys under name changed after index.
	wait(ctx context.Context, name string, index uint64) error
	close()
}

// reader opens a read-only client on the store the flags name, with the
// same TLS and authentication settings as the commands' sessions.
func (f *storeFlags) reader(ctx context.Context) (reader, error) {
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
			DialTimeout: 5 * time.Second,
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
			return nil, exitError{exitFailed, fmt.Errorf("%s: %w%s", f.describe(), err, diagnose(eps, cfg.TLS, err))}
		}
		return etcdReader{c: c, tls: cfg.TLS}, nil
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
		return consulReader{c}, nil
	default:
		return nil, usagef("--backend %q: want etcd or consul", *f.backend)
	}
}

// requestTimeout bounds each read of status.
const requestTimeout = 10 * time.Second

// etcdSemaphoreValue starts the value of an etcd semaphore's keys; the
// limit follows.
const etcdSemaphoreValue = "holdfast semaphore limit="

type etcdReader struct {
	c   *clientv3.Client
	tls *tls.Config // for a diagnosis
}

func (r etcdReader) close() { r.c.Close() }

func (r etcdReader) read(ctx context.Context, name string) (*state, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	pfx := name + "/"
	resp, err := r.c.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("etcd: read %s: %w%s", pfx, err, diagnose(r.c.Endpoints(), r.tls, err))
	}
	st := &state{Backend: "etcd", Name: name, Index: uint64(resp.Header.Revision)}
	for _, kv := range resp.Kvs {
		id := string(kv.Key[len(pfx):])
		if _, err := strconv.ParseUint(id, 16, 64); err != nil || kv.Lease == 0 {
			st.Other = append(st.Other, string(kv.Key))
			continue
		}
		e := entry{Role: "waiter", Position: len(st.Entries), Key: string(kv.Key), Session: fmt.Sprintf("lease %x", kv.Lease), Value: string(kv.Value)}
		if l, ok := strings.CutPrefix(e.Value, etcdSemaphoreValue); ok && st.Limit == 0 {
			if n, err := strconv.Atoi(l); err == nil && n > 0 {
				st.Kind, st.Limit = "semaphore", n
			}
		}
		if len(st.Entries) < max(st.Limit, 1) {
			e.Role, e.Token = "holder", uint64(kv.CreateRevision)
		}
		if ttl, err := r.c.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil && ttl.TTL >= 0 {
			left := ttl.TTL
			e.TTLLeft = &left
		}
		st.Entries = append(st.Entries, e)
	}
	return st, nil
}

// diagnose says why etcd could not be reached in time (its client waits
// for a connection until the deadline), from one TLS or TCP probe of each
// endpoint: "" if the error is another, or if an endpoint looks fine.
func diagnose(endpoints []string, tlsCfg *tls.Config, err error) string {
	if !errors.Is(err, context.DeadlineExceeded) {
		return ""
	}
	var errs []string
	for _, ep := range endpoints {
		host, cfg := ep, tlsCfg
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			host = u.Host
			if cfg == nil && u.Scheme == "https" {
				cfg = &tls.Config{} // the system's roots
			}
		}
		err := tlsfiles.Probe(host, cfg, 500*time.Millisecond)
		if err == nil {
			return ""
		}
		errs = append(errs, err.Error())
	}
	return "; " + strings.Join(errs, "; ")
}

func (r etcdReader) wait(ctx context.Context, name string, index uint64) error {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range r.c.Watch(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithRev(int64(index)+1)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("etcd: watch %s/: %w", name, err)
		}
		if len(wr.Events) > 0 {
			return nil
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("etcd: watch ended")
}

type consulReader struct{ c *api.Client }

func (r consulReader) close() {}

func (r consulReader) read(ctx context.Context, name string) (*state, error) {
	return r.list(ctx, name, 0)
}

// list reads the keys under name/ (blocking until they change after index,
// if index is not 0) and builds the state.
func (r consulReader) list(ctx context.Context, name string, index uint64) (*state, error) {
	timeout := requestTimeout
	if index != 0 {
		timeout = 5*time.Minute + 30*time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	q := (&api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx)
	pairs, meta, err := r.c.KV().List(name+"/", q)
	if err != nil {
		return nil, fmt.Errorf("consul: read %s/: %w", name, err)
	}
	st := &state{Backend: "consul", Name: name, Index: meta.LastIndex}
	lockKey := hfconsul.LockKey(name)
	for _, p := range pairs {
		if p.Key == lockKey && p.Flags == hfconsul.SemaphoreFlagValue {
			r.semaphore(ctx, st, lockKey, p, pairs)
			return st, nil
		}
	}
	queuePfx := name + "/.queue/"
	var queue []*api.KVPair
	var lock *api.KVPair
	for _, p := range pairs {
		switch {
		case p.Key == lockKey:
			lock = p
		case strings.HasPrefix(p.Key, queuePfx) && !strings.Contains(p.Key[len(queuePfx):], "/"):
			if p.Session != "" {
				queue = append(queue, p)
			}
		default:
			st.Other = append(st.Other, p.Key)
		}
	}
	sort.Slice(queue, func(i, j int) bool { return queue[i].CreateIndex < queue[j].CreateIndex })
	sessions := map[string]*api.SessionEntry{}
	info := func(id string) *api.SessionEntry {
		if s, ok := sessions[id]; ok {
			return s
		}
		s, _, err := r.c.Session().Info(id, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			s = nil
		}
		sessions[id] = s
		return s
	}
	add := func(role string, p *api.KVPair, token uint64) {
		e := entry{Role: role, Position: len(st.Entries), Key: p.Key, Token: token, Session: p.Session}
		if role == "holder" {
			e.Value = string(p.Value)
			e.Native = !strings.HasPrefix(e.Value, "holdfast")
		}
		if s := info(p.Session); s != nil {
			e.TTL, e.LockDelay = s.TTL, s.LockDelay.String()
		}
		st.Entries = append(st.Entries, e)
	}
	if lock != nil && lock.Session != "" {
		add("holder", lock, hfconsul.HolderToken(lock))
	}
	for _, p := range queue {
		add("waiter", p, 0)
	}
	return st, nil
}

// semaphore fills st from a semaphore's keys (api.Semaphore's layout): the
// holders named in the lock key that still hold their contender key, then
// the other contenders in order of arrival.
func (r consulReader) semaphore(ctx context.Context, st *state, lockKey string, lock *api.KVPair, pairs api.KVPairs) {
	st.Kind = "semaphore"
	var body struct {
		Limit   int
		Holders map[string]bool
	}
	if err := json.Unmarshal(lock.Value, &body); err != nil {
		st.Other = append(st.Other, fmt.Sprintf("%s (undecodable: %v)", lockKey, err))
	}
	st.Limit = body.Limit
	var holders, waiters []*api.KVPair
	for _, p := range pairs {
		id, ok := strings.CutPrefix(p.Key, st.Name+"/")
		switch {
		case p.Key == lockKey:
		case !ok || strings.Contains(id, "/") || p.Flags != hfconsul.SemaphoreFlagValue:
			st.Other = append(st.Other, p.Key)
		case p.Session == "":
			// a dead contender's key, pruned by the next write
		case body.Holders[p.Session]:
			holders = append(holders, p)
		default:
			waiters = append(waiters, p)
		}
	}
	byArrival := func(ps []*api.KVPair) {
		sort.Slice(ps, func(i, j int) bool { return ps[i].CreateIndex < ps[j].CreateIndex })
	}
	byArrival(holders)
	byArrival(waiters)
	for i, p := range append(holders, waiters...) {
		e := entry{Role: "waiter", Position: i, Key: p.Key, Session: p.Session, Value: string(p.Value)}
		if i < len(holders) {
			e.Role = "holder"
			if e.Value == "holdfast held" {
				e.Token = p.ModifyIndex // the write that admitted it
			} else {
				e.Native = true
			}
		}
		if s, _, err := r.c.Session().Info(p.Session, (&api.QueryOptions{}).WithContext(ctx)); err == nil && s != nil {
			e.TTL, e.LockDelay = s.TTL, s.LockDelay.String()
		}
		st.Entries = append(st.Entries, e)
	}
}

func (r consulReader) wait(ctx context.Context, name string, index uint64) error {
	for {
		st, err := r.list(ctx, name, index)
		if err != nil {
			return err
		}
		if st.Index != index {
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

func (p printer) print(st *state) error {
	if p.json {
		return json.NewEncoder(p.w).Encode(st)
	}
	if p.clear {
		fmt.Fprint(p.w, "\x1b[H\x1b[2J")
	}
	kind := st.Kind
	if st.Limit > 0 {
		kind = fmt.Sprintf("%s (limit %d)", kind, st.Limit)
	}
	fmt.Fprintf(p.w, "%s %s %q at index %d: ", st.Backend, kind, st.Name, st.Index)
	switch {
	case len(st.Entries) == 0:
		fmt.Fprintln(p.w, "free, nobody waits")
	default:
		fmt.Fprintf(p.w, "%d contender(s)\n", len(st.Entries))
		tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ROLE\t#\tTOKEN\tSESSION\tTTL\tKEY\tVALUE")
		for _, e := range st.Entries {
			tok := "-"
			if e.Token != 0 {
				tok = strconv.FormatUint(e.Token, 10)
			}
			ttl := e.TTL
			if e.TTLLeft != nil {
				ttl = fmt.Sprintf("%ds left", *e.TTLLeft)
			}
			if e.LockDelay != "" {
				ttl += " (lock-delay " + e.LockDelay + ")"
			}
			val := e.Value
			if e.Native {
				val += " (not holdfast)"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", e.Role, e.Position, tok, e.Session, ttl, e.Key, val)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, k := range st.Other {
		fmt.Fprintf(p.w, "other key under %s/: %s\n", st.Name, k)
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
