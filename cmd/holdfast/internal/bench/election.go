package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/holdfast/holdfast"
	hfconsul "github.com/holdfast/holdfast/consul"
	hfetcd "github.com/holdfast/holdfast/etcd"
)

// ScenarioElection: a leader's session is revoked (etcd) or destroyed
// (Consul) while a candidate waits and an observer watches; failover_ms is
// the time from the kill to the candidate's Campaign returning, observe_ms
// the time from the kill to the observer delivering the new leader.
// holdfast's Election against concurrency.Election on etcd, and against an
// api.Lock-based election (api.Lock with the proposal as value, observed
// with blocking queries on the key) on Consul.
const ScenarioElection = "election"

// electionImpl is one election implementation on a target.
type electionImpl interface {
	name() string
	// candidate opens a client and a session and returns a candidate on
	// election that campaigns with value.
	candidate(ctx context.Context, election, value string, delay time.Duration) (elector, error)
	// observe opens a client and follows the election's leader: it sends
	// the leader's value ("" for none) on the channel at each change it
	// sees, until ctx ends.
	observe(ctx context.Context, election string) (<-chan string, error)
}

// elector is one candidate.
type elector interface {
	campaign(ctx context.Context) error
	sessionID() string
	close()
}

// electionImpls returns the implementations of t, holdfast first.
func electionImpls(t Target, ttl time.Duration) []electionImpl {
	switch t := t.(type) {
	case *EtcdTarget:
		s := ttlSeconds(ttl)
		return []electionImpl{etcdElections{t, false, s}, etcdElections{t, true, s}}
	case *ConsulTarget:
		return []electionImpl{consulElections{t, false}, consulElections{t, true}}
	}
	return nil
}

// election runs the election rows: per lock-delay (Consul) or once (etcd),
// per implementation, Repeats times (default 3).
func (r *runner) election(ctx context.Context) error {
	delays := r.opts.LockDelays
	if r.t.Backend() != "consul" {
		delays = []time.Duration{0}
	}
	for _, d := range delays {
		reps := r.opts.Repeats
		if reps == 0 {
			reps = 3
			if d >= 10*time.Second {
				reps = 2
			}
		}
		var rows []Result
		for _, impl := range electionImpls(r.t, r.opts.TTL) {
			r.logf("%s election %s: lock-delay %v, %d repeats", r.t.Backend(), impl.name(), d, reps)
			res, err := r.electionRow(ctx, impl, d, reps)
			if err != nil {
				return fmt.Errorf("%s election %s, lock-delay %v: %w", r.t.Backend(), impl.name(), d, err)
			}
			r.emit(res)
			rows = append(rows, res)
		}
		r.pair(rows)
	}
	return nil
}

func (r *runner) electionRow(ctx context.Context, impl electionImpl, delay time.Duration, reps int) (Result, error) {
	res := Result{
		Scenario:   ScenarioElection,
		Backend:    r.t.Backend(),
		Impl:       impl.name(),
		Contenders: 2,
		Nodes:      r.nodes(),
		RPCUnit:    r.t.RPCUnit(),
		TTLS:       r.opts.TTL.Seconds(),
		Repeats:    reps,
		Note:       electionNote(r.t.Backend(), impl.name()),
	}
	if r.t.Backend() == "consul" {
		res.TTLS = consulTTL(r.opts.TTL).Seconds()
		res.LockDelayMS = num(ms(delay))
	}
	var failovers, observes []time.Duration
	start := time.Now()
	for rep := range reps {
		fo, ob, err := r.electionOnce(ctx, impl, delay, rep)
		if err != nil {
			if ctx.Err() != nil {
				return Result{}, ctx.Err()
			}
			res.Errors++
			if res.FirstError == "" {
				res.FirstError = err.Error()
			}
			continue
		}
		res.Acquisitions++
		res.Handoffs++
		failovers = append(failovers, fo)
		observes = append(observes, ob)
		res.FailoverAll = append(res.FailoverAll, round(ms(fo)))
	}
	res.DurationS = round(time.Since(start).Seconds())
	res.FailoverMS = percentile(failovers, 0.5)
	res.ObserveMS = percentile(observes, 0.5)
	return res, nil
}

func electionNote(backend, impl string) string {
	switch {
	case backend == "etcd" && impl == ImplHoldfast:
		return "holdfast etcd.Election; leader's lease revoked"
	case backend == "etcd":
		return "concurrency.Election; leader's lease revoked"
	case impl == ImplHoldfast:
		return "holdfast consul.Election; leader's session destroyed; retries when the lock-delay ends"
	}
	return "api.Lock with the proposal as value, observed by blocking queries; leader's session destroyed; api.Lock retries every 5 s during a lock-delay"
}

// electionOnce measures one failover: the failover time and the observe
// time, both from the kill.
func (r *runner) electionOnce(ctx context.Context, impl electionImpl, delay time.Duration, rep int) (failover, observe time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, delay+takeoverSlack)
	defer cancel()
	name := r.lockName(ScenarioElection, impl.name(), ms(delay), rep)
	leaderValue, nextValue := fmt.Sprintf("leader-%d", rep), fmt.Sprintf("candidate-%d", rep)
	l, err := impl.candidate(ctx, name, leaderValue, delay)
	if err != nil {
		return 0, 0, err
	}
	defer l.close()
	if err := l.campaign(ctx); err != nil {
		return 0, 0, fmt.Errorf("first campaign: %w", err)
	}
	c, err := impl.candidate(ctx, name, nextValue, delay)
	if err != nil {
		return 0, 0, err
	}
	defer c.close()
	won := make(chan error, 1)
	var wonAt time.Time
	go func() {
		err := c.campaign(ctx)
		wonAt = time.Now()
		won <- err
	}()
	seen, err := impl.observe(ctx, name)
	if err != nil {
		return 0, 0, err
	}
	// The observer has seen the first leader, the candidate waits.
	for v := range seen {
		if v == leaderValue {
			break
		}
	}
	time.Sleep(settle)
	select {
	case err := <-won:
		return 0, 0, fmt.Errorf("the candidate won while the leader lived: %v", err)
	default:
	}
	killed := time.Now()
	if err := r.t.Kill(ctx, l.sessionID()); err != nil {
		return 0, 0, fmt.Errorf("kill: %w", err)
	}
	var observedAt time.Time
	for v := range seen {
		if v == nextValue {
			observedAt = time.Now()
			break
		}
	}
	if err := <-won; err != nil {
		return 0, 0, fmt.Errorf("campaign: %w", err)
	}
	if observedAt.IsZero() {
		return 0, 0, errors.New("the observer did not see the new leader")
	}
	return wonAt.Sub(killed), observedAt.Sub(killed), nil
}

// etcdElections: holdfast's etcd.Election, or concurrency.Election.
type etcdElections struct {
	t      *EtcdTarget
	native bool
	ttl    int // seconds
}

func (e etcdElections) name() string {
	if e.native {
		return ImplNative
	}
	return ImplHoldfast
}

type etcdElector struct {
	cli     *clientv3.Client
	id      clientv3.LeaseID
	closeFn func()
}

func (c *etcdElector) sessionID() string { return fmt.Sprintf("%x", int64(c.id)) }
func (c *etcdElector) close()            { c.closeFn(); c.cli.Close() }

func (e etcdElections) candidate(ctx context.Context, election, value string, _ time.Duration) (elector, error) {
	cli, err := e.t.newClient(nil)
	if err != nil {
		return nil, err
	}
	ttl := e.ttl
	if e.native {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
		if err != nil {
			cli.Close()
			return nil, err
		}
		el := concurrency.NewElection(s, election)
		return &etcdCandidate{etcdElector{cli: cli, id: s.Lease(), closeFn: func() { _ = s.Close() }},
			func(ctx context.Context) error { return el.Campaign(ctx, value) }}, nil
	}
	s, err := hfetcd.NewSession(ctx, cli, hfetcd.WithTTL(time.Duration(ttl)*time.Second))
	if err != nil {
		cli.Close()
		return nil, err
	}
	el, err := hfetcd.NewElection(s, election)
	if err != nil {
		_ = s.Close()
		cli.Close()
		return nil, err
	}
	return &etcdCandidate{etcdElector{cli: cli, id: s.Lease(), closeFn: func() { _ = s.Close() }},
		func(ctx context.Context) error { _, err := el.Campaign(ctx, []byte(value)); return err }}, nil
}

type etcdCandidate struct {
	etcdElector
	run func(ctx context.Context) error
}

func (c *etcdCandidate) campaign(ctx context.Context) error { return c.run(ctx) }

func (e etcdElections) observe(ctx context.Context, election string) (<-chan string, error) {
	cli, err := e.t.newClient(nil)
	if err != nil {
		return nil, err
	}
	out := make(chan string, 64)
	if e.native {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(e.ttl))
		if err != nil {
			cli.Close()
			return nil, err
		}
		ch := concurrency.NewElection(s, election).Observe(ctx)
		go func() {
			defer cli.Close()
			defer s.Close()
			defer close(out)
			for r := range ch {
				select {
				case out <- string(r.Kvs[0].Value):
				case <-ctx.Done():
				}
			}
		}()
		return out, nil
	}
	s, err := hfetcd.NewSession(ctx, cli, hfetcd.WithTTL(time.Duration(e.ttl)*time.Second))
	if err != nil {
		cli.Close()
		return nil, err
	}
	el, err := hfetcd.NewElection(s, election)
	if err != nil {
		_ = s.Close()
		cli.Close()
		return nil, err
	}
	go forwardLeaders(ctx, el.Observe(ctx), out, func() { _ = s.Close(); cli.Close() })
	return out, nil
}

// forwardLeaders sends the values of leaders ("" for none) to out until in
// is closed, then calls done and closes out.
func forwardLeaders(ctx context.Context, in <-chan holdfast.Leader, out chan<- string, done func()) {
	defer close(out)
	defer done()
	for l := range in {
		select {
		case out <- string(l.Value):
		case <-ctx.Done():
		}
	}
}

// consulElections: holdfast's consul.Election, or api.Lock.
type consulElections struct {
	t      *ConsulTarget
	native bool
}

func (e consulElections) name() string {
	if e.native {
		return ImplNative
	}
	return ImplHoldfast
}

type consulCandidate struct {
	id    string
	run   func(ctx context.Context) error
	close func()
}

type consulElector struct{ c consulCandidate }

func (c *consulElector) campaign(ctx context.Context) error { return c.c.run(ctx) }
func (c *consulElector) sessionID() string                  { return c.c.id }
func (c *consulElector) close()                             { c.c.close() }

func (e consulElections) candidate(ctx context.Context, election, value string, delay time.Duration) (elector, error) {
	if !e.native {
		cli, tr, err := e.t.newClient(nil)
		if err != nil {
			return nil, err
		}
		s, err := hfconsul.NewSession(ctx, cli, hfconsul.WithTTL(hfconsul.MinTTL), hfconsul.WithLockDelay(delay))
		if err != nil {
			tr.CloseIdleConnections()
			return nil, err
		}
		el, err := hfconsul.NewElection(s, election)
		if err != nil {
			_ = s.Close()
			tr.CloseIdleConnections()
			return nil, err
		}
		return &consulElector{consulCandidate{
			id:    s.ID(),
			run:   func(ctx context.Context) error { _, err := el.Campaign(ctx, []byte(value)); return err },
			close: func() { _ = s.Close(); tr.CloseIdleConnections() },
		}}, nil
	}
	c, err := consulNative{e.t}.NewContender(ctx, ContenderConfig{Lock: election, Counter: &Counter{}, TTL: hfconsul.MinTTL, LockDelay: delay})
	if err != nil {
		return nil, err
	}
	nc := c.(*consulNativeContender)
	lock, err := nc.cli.LockOpts(&api.LockOptions{Key: hfconsul.LockKey(election), Session: nc.id, Value: []byte(value)})
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	return &consulElector{consulCandidate{
		id: nc.id,
		run: func(ctx context.Context) error {
			lost, err := lock.Lock(ctx.Done())
			if err == nil && lost == nil {
				err = ctx.Err()
			}
			return err
		},
		close: func() { _ = nc.Close() },
	}}, nil
}

func (e consulElections) observe(ctx context.Context, election string) (<-chan string, error) {
	cli, tr, err := e.t.newClient(nil)
	if err != nil {
		return nil, err
	}
	out := make(chan string, 64)
	if !e.native {
		s, err := hfconsul.NewSession(ctx, cli, hfconsul.WithTTL(hfconsul.MinTTL))
		if err != nil {
			tr.CloseIdleConnections()
			return nil, err
		}
		el, err := hfconsul.NewElection(s, election)
		if err != nil {
			_ = s.Close()
			tr.CloseIdleConnections()
			return nil, err
		}
		go forwardLeaders(ctx, el.Observe(ctx), out, func() { _ = s.Close(); tr.CloseIdleConnections() })
		return out, nil
	}
	go blockingObserve(ctx, cli, tr, hfconsul.LockKey(election), out)
	return out, nil
}

// blockingObserve follows key with blocking queries, as a Consul user of
// api.Lock would, and sends the value of its holder ("" when free) at each
// change.
func blockingObserve(ctx context.Context, cli *api.Client, tr *http.Transport, key string, out chan<- string) {
	defer close(out)
	defer tr.CloseIdleConnections()
	var index uint64
	last, first := "", true
	for ctx.Err() == nil {
		kv, meta, err := cli.KV().Get(key, (&api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Second}).WithContext(ctx))
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		index = meta.LastIndex
		v := ""
		if kv != nil && kv.Session != "" {
			v = string(kv.Value)
		}
		if first || v != last {
			first, last = false, v
			select {
			case out <- v:
			case <-ctx.Done():
			}
		}
	}
}
