package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/holdfast/holdfast"
	hfconsul "github.com/holdfast/holdfast/consul"
	hfetcd "github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/shard"
)

// ScenarioShard: a shard group (package shard) of N shards x M members,
// started together: the time until every shard is owned and the members
// balanced (cold_ms); then one member joins and one leaves: shards moved
// and time to settle, and the store requests of every member while the
// group settles, per shard moved. A shard seen owned by two members at once
// is a violation. Sizes 64 x 8 and 1,024 x 16 (quick: 16 x 4). Not in
// "all".
const ScenarioShard = "shard"

// ShardResult is one row of the shard scenario.
type ShardResult struct {
	Scenario        string  `json:"scenario"`
	Backend         string  `json:"backend"`
	Impl            string  `json:"impl"` // "holdfast": no native recipe to compare
	Shards          int     `json:"shards"`
	Members         int     `json:"members"`
	ColdMs          float64 `json:"cold_ms"`
	JoinMoved       int     `json:"join_moved"`
	JoinSettleMs    float64 `json:"join_settle_ms"`
	JoinReqPerMove  float64 `json:"join_requests_per_move"`
	LeaveMoved      int     `json:"leave_moved"`
	LeaveSettleMs   float64 `json:"leave_settle_ms"`
	LeaveReqPerMove float64 `json:"leave_requests_per_move"`
	Violations      int     `json:"violations"`
	Errors          int     `json:"errors"`
	Note            string  `json:"note,omitempty"`
}

// shardMember is one member of the group under test.
type shardMember struct {
	owned  func() []shard.Shard
	c      *Counter
	cancel context.CancelFunc
	done   chan error
	close  func()
}

func init() {
	registerScenario(scenarioSpec{
		name:  ScenarioShard,
		run:   (*runner).shard,
		quick: func(o Options) Options { return o },
		table: func(w io.Writer, rows []any) error {
			var rs []ShardResult
			for _, row := range rows {
				if r, ok := row.(ShardResult); ok {
					rs = append(rs, r)
				}
			}
			if len(rs) == 0 {
				return nil
			}
			fmt.Fprintln(w, "backend  shards x members  cold_ms  join: moved settle_ms req/move  leave: moved settle_ms req/move  violations")
			for _, r := range rs {
				fmt.Fprintf(w, "%-7s  %6d x %-7d  %7.0f  %11d %9.0f %8.1f  %12d %9.0f %8.1f  %d\n", r.Backend, r.Shards, r.Members, r.ColdMs,
					r.JoinMoved, r.JoinSettleMs, r.JoinReqPerMove, r.LeaveMoved, r.LeaveSettleMs, r.LeaveReqPerMove, r.Violations)
				if r.Note != "" {
					fmt.Fprintf(w, "note (%s %dx%d): %s\n", r.Backend, r.Shards, r.Members, r.Note)
				}
			}
			return nil
		},
	})
}

// shard runs the shard scenario's rows.
func (r *runner) shard(ctx context.Context) error {
	sizes := [][2]int{{64, 8}, {1024, 16}}
	if r.opts.Quick {
		sizes = [][2]int{{16, 4}}
	}
	for _, sz := range sizes {
		r.logf("%s shard: %d shards x %d members", r.t.Backend(), sz[0], sz[1])
		res := r.shardRow(ctx, sz[0], sz[1])
		r.emitOther(res, res.Violations, res.Errors)
	}
	return nil
}

// join starts one member of group.
func (r *runner) shardJoin(ctx context.Context, group string, n int) (*shardMember, error) {
	m := &shardMember{c: &Counter{}, done: make(chan error, 1)}
	work := func(ctx context.Context, _ shard.Shard, _ holdfast.Grant) { <-ctx.Done() }
	rctx, cancel := context.WithCancel(ctx)
	m.cancel = cancel
	cfg := shard.Config{Shards: n}
	switch t := r.t.(type) {
	case *EtcdTarget:
		cli, err := t.newClient(m.c)
		if err != nil {
			cancel()
			return nil, err
		}
		s, err := hfetcd.NewSession(ctx, cli, hfetcd.WithTTL(r.opts.TTL))
		if err != nil {
			cancel()
			cli.Close()
			return nil, err
		}
		g, err := shard.New(shard.Etcd(s), group, cfg)
		if err != nil {
			cancel()
			s.Close()
			cli.Close()
			return nil, err
		}
		m.owned, m.close = g.Owned, func() { s.Close(); cli.Close() }
		go func() {
			m.done <- g.Run(rctx, func(ctx context.Context, sh shard.Shard, gr *hfetcd.Grant) { work(ctx, sh, gr) })
		}()
	case *ConsulTarget:
		cli, tr, err := t.newClient(m.c)
		if err != nil {
			cancel()
			return nil, err
		}
		s, err := hfconsul.NewSession(ctx, cli, hfconsul.WithTTL(max(r.opts.TTL, hfconsul.MinTTL)), hfconsul.WithLockDelay(0))
		if err != nil {
			cancel()
			tr.CloseIdleConnections()
			return nil, err
		}
		g, err := shard.New(shard.Consul(s), group, cfg)
		if err != nil {
			cancel()
			s.Close()
			tr.CloseIdleConnections()
			return nil, err
		}
		m.owned, m.close = g.Owned, func() { s.Close(); (*http.Transport).CloseIdleConnections(tr) }
		go func() {
			m.done <- g.Run(rctx, func(ctx context.Context, sh shard.Shard, gr *hfconsul.Grant) { work(ctx, sh, gr) })
		}()
	default:
		cancel()
		return nil, fmt.Errorf("shard scenario: unknown target %T", r.t)
	}
	return m, nil
}

// shardRow measures one size.
func (r *runner) shardRow(ctx context.Context, n, members int) (res ShardResult) {
	res = ShardResult{Scenario: ScenarioShard, Backend: r.t.Backend(), Impl: "holdfast", Shards: n, Members: members}
	group := fmt.Sprintf("bench/%s/shard-%d-%d", r.runID, n, members)
	var live []*shardMember
	var all []*shardMember
	defer func() {
		for _, m := range all {
			m.cancel()
			<-m.done
			m.close()
		}
	}()
	// owners returns each shard's owner (-1: none) among live, counting a
	// shard owned twice as a violation.
	owners := func() []int {
		own := make([]int, n)
		for i := range own {
			own[i] = -1
		}
		for mi, m := range live {
			for _, s := range m.owned() {
				if own[s.Index] >= 0 {
					res.Violations++
				}
				own[s.Index] = mi
			}
		}
		return own
	}
	settle := func() ([]int, time.Duration, error) {
		began := time.Now()
		for {
			own := owners()
			load := make([]int, len(live))
			ok := true
			for _, o := range own {
				if o < 0 {
					ok = false
					break
				}
				load[o]++
			}
			for _, l := range load {
				if l < n/len(live) || l > (n+len(live)-1)/len(live) {
					ok = false
				}
			}
			if ok {
				return own, time.Since(began), nil
			}
			if time.Since(began) > time.Minute {
				return nil, 0, fmt.Errorf("not balanced after 1 min")
			}
			select {
			case <-ctx.Done():
				return nil, 0, ctx.Err()
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
	requests := func() int64 {
		var t int64
		for _, m := range all {
			t += m.c.Requests()
		}
		return t
	}
	fail := func(what string, err error) ShardResult {
		res.Errors++
		res.Note = fmt.Sprintf("%s: %v", what, err)
		return res
	}
	for range members {
		m, err := r.shardJoin(ctx, group, n)
		if err != nil {
			return fail("start", err)
		}
		live, all = append(live, m), append(all, m)
	}
	own, took, err := settle()
	if err != nil {
		return fail("cold start", err)
	}
	res.ColdMs = float64(took.Microseconds()) / 1e3

	// One more member joins.
	before := requests()
	m, err := r.shardJoin(ctx, group, n)
	if err != nil {
		return fail("join", err)
	}
	live, all = append(live, m), append(all, m)
	after, took, err := settle()
	if err != nil {
		return fail("join", err)
	}
	res.JoinSettleMs = float64(took.Microseconds()) / 1e3
	for i := range own {
		if own[i] != after[i] {
			res.JoinMoved++
		}
	}
	if res.JoinMoved > 0 {
		res.JoinReqPerMove = float64(requests()-before) / float64(res.JoinMoved)
	}

	// The first member leaves.
	before = requests()
	live[0].cancel()
	if err := <-live[0].done; err != nil {
		return fail("leave", err)
	}
	live[0].done <- nil
	live = live[1:]
	last, took, err := settle()
	if err != nil {
		return fail("leave", err)
	}
	res.LeaveSettleMs = float64(took.Microseconds()) / 1e3
	for i := range after {
		if after[i] == 0 || after[i]-1 != last[i] {
			res.LeaveMoved++
		}
	}
	if res.LeaveMoved > 0 {
		res.LeaveReqPerMove = float64(requests()-before) / float64(res.LeaveMoved)
	}
	return res
}
