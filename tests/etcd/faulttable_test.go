package etcd_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/internal/core"
)

// The request-fault table: every kind of request each primitive's
// algorithm sends, times the three fault modes of etcdtest.Faults, times
// the primitives. Each case runs one short scenario (ftScenario) with one
// fault injected at the first request of its kind and checks exclusion,
// liveness and that nothing is left behind. The kinds are not listed by
// hand from the code: a fault-free run of the scenario records the shape
// of every request (requestKind), and TestEtcdFaultTable fails if one is
// missing from ftKinds, so a new kind of request cannot be left out
// silently. `make faults` runs the whole table (-faults.full); the default
// run takes the mutex's cases and one mode per kind of the others' own;
// -faults.case picks cases by name. The once-per-period claim has a
// scenario of its own (ftClaimScenario), and logs each case's runs and
// skips.

var faultsFull = flag.Bool("faults.full", false, "run the whole request-fault table (make faults)")

var faultsCase = flag.String("faults.case", "", `run only the cases of the request-fault table whose "<primitive>, <step>, <mode>" contains this`)

// ftTTL is the sessions' TTL in the table: a session that a fault ends
// expires soon.
const ftTTL = 3 * time.Second

// ftGrant is what the table needs of a grant.
type ftGrant interface {
	Context() context.Context
	Unlock(context.Context) error
}

// ftPrim is a primitive of the table: lock returns client i's acquisition
// on s (reader: an RWMutex's odd clients read); limit is how many grants
// may be live at once (for the RWMutex, 1: a writer with anyone is a
// violation, readers together are not).
type ftPrim struct {
	name  string
	limit int
	lock  func(t *testing.T, s *etcd.Session, name string, i int) (lock, try func(context.Context) (ftGrant, error), reader bool)
	claim bool // the once-per-period claim: ftClaimScenario, not ftScenario
}

var ftPrims = []ftPrim{
	{name: "mutex", limit: 1, lock: func(t *testing.T, s *etcd.Session, name string, _ int) (lock, try func(context.Context) (ftGrant, error), reader bool) {
		m := newMutex(t, s, name)
		return grantOf(m.Lock), grantOf(m.TryLock), false
	}},
	{name: "semaphore", limit: 2, lock: func(t *testing.T, s *etcd.Session, name string, _ int) (lock, try func(context.Context) (ftGrant, error), reader bool) {
		m, err := etcd.NewSemaphore(s, name, 2)
		if err != nil {
			t.Fatal(err)
		}
		return grantOf(m.Lock), grantOf(m.TryLock), false
	}},
	{name: "rwmutex", limit: 1, lock: func(t *testing.T, s *etcd.Session, name string, i int) (lock, try func(context.Context) (ftGrant, error), reader bool) {
		m, err := etcd.NewRWMutex(s, name)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			return grantOf(m.RLock), grantOf(m.TryRLock), true
		}
		if i == 0 { // the first holder downgrades, then releases its read grant
			return func(ctx context.Context) (ftGrant, error) {
				g, err := m.Lock(ctx)
				if err != nil {
					return nil, err
				}
				return downgrading{g, m}, nil
			}, grantOf(m.TryLock), false
		}
		return grantOf(m.Lock), grantOf(m.TryLock), false
	}},
	{name: "election", limit: 1, lock: func(t *testing.T, s *etcd.Session, name string, i int) (lock, try func(context.Context) (ftGrant, error), reader bool) {
		e := newElection(t, s, name)
		return func(ctx context.Context) (ftGrant, error) {
			g, err := e.Campaign(ctx, fmt.Appendf(nil, "candidate %d", i))
			if err == nil {
				_ = e.Proclaim(ctx, fmt.Appendf(nil, "leader %d", i)) // a fault may fail it
			}
			return g, err
		}, nil, false
	}},
	{name: "multi", limit: 1, lock: func(t *testing.T, s *etcd.Session, name string, _ int) (lock, try func(context.Context) (ftGrant, error), reader bool) {
		m, err := etcd.NewMultiMutex(s, name+"-b", name+"-a")
		if err != nil {
			t.Fatal(err)
		}
		return grantOf(m.Lock), grantOf(m.TryLock), false
	}},
	{name: "claim", claim: true},
}

// downgrading is a write grant whose Unlock downgrades it and releases the
// read grant.
type downgrading struct {
	*etcd.Grant
	rw *etcd.RWMutex
}

func (d downgrading) Unlock(ctx context.Context) error {
	r, err := d.rw.Downgrade(ctx, d.Grant)
	if err != nil {
		return err
	}
	return r.Unlock(ctx)
}

func grantOf[G ftGrant](f func(context.Context) (G, error)) func(context.Context) (ftGrant, error) {
	return func(ctx context.Context) (ftGrant, error) {
		g, err := f(ctx)
		if err != nil {
			return nil, err
		}
		return g, nil
	}
}

// requestKind names the shape of a request: its method and, for a Txn, its
// compares and operations without their keys and values, so that one kind
// is one place in the code that sends it.
func requestKind(method string, req any) string {
	m := method[strings.LastIndex(method, "/")+1:]
	if r, ok := req.(*pb.TxnRequest); ok {
		return "Txn" + txnShape(r)
	}
	if r, ok := req.(*pb.RangeRequest); ok && r.RangeEnd != nil {
		return m + "(prefix)"
	}
	return m
}

func txnShape(r *pb.TxnRequest) string {
	var b strings.Builder
	b.WriteString("(if ")
	for i, c := range r.Compare {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(strings.ToLower(c.Target.String()) + c.Result.String()[:2])
		if c.RangeEnd != nil {
			b.WriteString("*")
		}
	}
	b.WriteString(" then " + opsShape(r.Success) + " else " + opsShape(r.Failure) + ")")
	return b.String()
}

func opsShape(ops []*pb.RequestOp) string {
	var s []string
	for _, op := range ops {
		switch o := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			s = append(s, "get")
		case *pb.RequestOp_RequestPut:
			s = append(s, "put")
		case *pb.RequestOp_RequestDeleteRange:
			s = append(s, "del")
		case *pb.RequestOp_RequestTxn:
			s = append(s, "txn"+txnShape(o.RequestTxn))
		}
	}
	return "[" + strings.Join(s, ",") + "]"
}

// ftScenario is one run of the table's scenario on a fresh name, with
// faults (armed or not) on every client. Clients 0..limit-1 take the lock
// and hold it for hold (an election's leader proclaims as it is granted); client
// limit waits, client limit+1 gives up after 200 ms, client limit+2 joins
// 400 ms later (after a late request of the one that gave up has landed), and one TryLock is refused meanwhile (if the primitive has
// one). Every acquisition but the one that gives up is retried until it
// succeeds (a live contender keeps asking), for at most 8 s. It returns
// what the checkers found.
type ftResult struct {
	problems []string
	lost     bool   // a session ended: the liveness bound is then TTL + 1 s
	note     string // what the case reports besides its problems (a claim's runs and skips)
}

// ftSession opens a session of TTL ftTTL on a client of its own whose
// requests f faults (quit too, for the contender that gives up); its
// close function closes the session, then the client.
func ftSession(t *testing.T, c *etcdtest.Cluster, f, quit *etcdtest.Faults, quitter bool) (*etcd.Session, func()) {
	t.Helper()
	install := f.Install
	if quitter {
		install = func(cfg *clientv3.Config) { f.Install(cfg); quit.Install(cfg) }
	}
	cli, err := c.NewClient(install)
	if err != nil {
		t.Fatal(err)
	}
	s, err := etcd.NewSession(context.Background(), cli, etcd.WithTTL(ftTTL))
	if err != nil {
		cli.Close()
		t.Fatal(err)
	}
	return s, func() { _ = s.Close(); cli.Close() }
}

func ftScenario(t *testing.T, c *etcdtest.Cluster, admin *clientv3.Client, f, quit *etcdtest.Faults, arm func(), p ftPrim, name string, slack, hold time.Duration) ftResult {
	t.Helper()
	var res ftResult
	var mu sync.Mutex
	problem := func(format string, a ...any) {
		mu.Lock()
		res.problems = append(res.problems, fmt.Sprintf(format, a...))
		mu.Unlock()
	}
	before := leaseIDs(t, admin)
	n := p.limit + 3
	sessions := make([]*etcd.Session, n+1) // the last only tries
	locks := make([]func(context.Context) (ftGrant, error), n+1)
	var try func(context.Context) (ftGrant, error)
	readers := make([]bool, n+1)
	for i := range n + 1 {
		var closeSession func()
		sessions[i], closeSession = ftSession(t, c, f, quit, i == p.limit+1) // the contender that gives up
		defer closeSession()
		var tr func(context.Context) (ftGrant, error)
		locks[i], tr, readers[i] = p.lock(t, sessions[i], name, i)
		if i == n {
			try = tr
		}
	}
	arm() // faults hit the primitives' requests, not the sessions' creation
	holders := p.limit
	// The record: waits and grants, for the liveness check.
	start := time.Now()
	var waits, held []ftSpan
	live := map[int]ftGrant{}
	granted := func(i int, g ftGrant, from time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Since(start)
		waits = append(waits, ftSpan{from, now})
		count, writer := 1, !readers[i]
		for j, h := range live {
			if h.Context().Err() == nil && j != i {
				count++
				writer = writer || !readers[j]
			}
		}
		if p.name == "rwmutex" && writer && count > 1 || p.name != "rwmutex" && count > p.limit {
			res.problems = append(res.problems, fmt.Sprintf("client %d granted while %d grants were live", i, count-1))
		}
		live[i] = g
		idx := len(held)
		held = append(held, ftSpan{now, -1})
		context.AfterFunc(g.Context(), func() {
			mu.Lock()
			held[idx].to = time.Since(start)
			mu.Unlock()
		})
	}
	failedWait := func(from time.Duration) {
		mu.Lock()
		waits = append(waits, ftSpan{from, time.Since(start)})
		mu.Unlock()
	}
	// take retries until granted (or 8 s), then holds for hold.
	take := func(i int, hold time.Duration) {
		deadline := time.Now().Add(8 * time.Second)
		for time.Now().Before(deadline) {
			from := time.Since(start)
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			g, err := locks[i](ctx)
			cancel()
			if err != nil {
				failedWait(from)
				if errors.Is(err, holdfast.ErrSessionLost) {
					mu.Lock()
					res.lost = true
					mu.Unlock()
					return
				}
				time.Sleep(20 * time.Millisecond)
				continue
			}
			granted(i, g, from)
			time.Sleep(hold)
			uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = g.Unlock(uctx) // a fault may fail it: the grant still ends
			cancel()
			return
		}
		problem("client %d not granted within 8 s", i)
	}
	var wg sync.WaitGroup
	for i := range holders {
		wg.Go(func() { take(i, hold) })
	}
	waitHeld := time.Now().Add(8 * time.Second)
	for time.Now().Before(waitHeld) {
		mu.Lock()
		k := len(held)
		mu.Unlock()
		if k == holders {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	wg.Go(func() { take(holders, 50*time.Millisecond) })
	time.Sleep(30 * time.Millisecond)
	wg.Go(func() { // gives up after 200 ms
		from := time.Since(start)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if g, err := locks[holders+1](ctx); err == nil {
			granted(holders+1, g, from)
			_ = g.Unlock(context.Background())
		} else {
			failedWait(from)
		}
	})
	time.Sleep(400 * time.Millisecond)
	wg.Go(func() { take(holders+2, 50*time.Millisecond) })
	if try != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		from := time.Since(start)
		if g, err := try(ctx); err == nil { // a delayed TryLock may come after the holders left
			granted(n, g, from)
			_ = g.Unlock(ctx)
		}
		cancel()
	}
	wg.Wait()
	// Liveness: no interval over the bound in which fewer grants than
	// the limit were live while someone waited.
	mu.Lock()
	bound := time.Second + slack
	if res.lost {
		bound += ftTTL
	}
	if gap := longestGap(waits, held, p.limit, time.Since(start)); gap > bound {
		res.problems = append(res.problems, fmt.Sprintf("free for %v while a contender waited (bound %v)", gap.Round(time.Millisecond), bound))
	}
	mu.Unlock()
	// Nothing left: close, let late requests land, then no key, no lease.
	for _, s := range sessions {
		_ = s.Close()
	}
	f.Wait()
	quit.Wait()
	deadline := time.Now().Add(ftTTL + 2*time.Second)
	for {
		ks := keys(t, admin, name)
		ls := newLeases(t, admin, before)
		if len(ks) == 0 && len(ls) == 0 {
			break
		}
		if time.Now().After(deadline) {
			res.problems = append(res.problems, fmt.Sprintf("left behind: keys %v, leases %v", ks, ls))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return res
}

// scenario runs p's scenario: ftClaimScenario for the claim, else
// ftScenario; mode is the case's (0: no fault).
func (p ftPrim) scenario(t *testing.T, c *etcdtest.Cluster, admin *clientv3.Client, f, quit *etcdtest.Faults, arm func(), name string, mode etcdtest.FaultMode, slack, hold time.Duration) ftResult {
	t.Helper()
	if p.claim {
		return ftClaimScenario(t, c, admin, f, quit, arm, name, mode)
	}
	return ftScenario(t, c, admin, f, quit, arm, p, name, slack, hold)
}

// ftClaimRounds is how many periods the claim's scenario claims, and
// ftClaimSched its schedule: the periods are explicit and Every apart,
// ahead of the wall clock, so that none is over while a case runs; AtMost
// (the claim lease's TTL) is well above core.ClaimCleanup, so that a lease
// left to expire is told from one the claim removed.
const ftClaimRounds = 4

var ftClaimSched = holdfast.Schedule{Every: 5 * time.Second, AtMost: 5 * time.Second}

// ftClaimScenario is the claim's scenario (etcd.Once), in place of
// ftScenario's: three claimants, one Once each on name through its own
// session and client (f on every client, quit on claimant 0's too), claim
// one period a round for ftClaimRounds rounds; in round k claimant k mod 3
// starts and the two others 30 ms later; the winner runs 30 ms and Unlocks
// before the next round; claimant 0's claims give up after 1 s. The
// checks:
//
//   - at most one run per period, runs never overlap, tokens increase;
//   - liveness: every period runs (one fault hits one claimant's request),
//     except in the late mode, where a period may be skipped
//     (docs/DESIGN.md, claims step 2): the note counts the skips;
//   - nothing left behind: no lease but the sessions' within
//     core.ClaimCleanup of the last late request's delivery while the
//     sessions live (step 3; in the late mode, a lease granted after its
//     claim gave up expires by its TTL, AtMost), then, once they are
//     closed, no key under name but the record name/.claim, and no lease.
func ftClaimScenario(t *testing.T, c *etcdtest.Cluster, admin *clientv3.Client, f, quit *etcdtest.Faults, arm func(), name string, mode etcdtest.FaultMode) ftResult {
	t.Helper()
	var res ftResult
	var mu sync.Mutex
	problem := func(format string, a ...any) {
		mu.Lock()
		res.problems = append(res.problems, fmt.Sprintf(format, a...))
		mu.Unlock()
	}
	before := leaseIDs(t, admin)
	var sessions []*etcd.Session
	var onces []*etcd.Once
	for i := range 3 {
		s, closeSession := ftSession(t, c, f, quit, i == 0) // the claimant that gives up
		defer closeSession()
		o, err := etcd.NewOnce(s, name, ftClaimSched)
		if err != nil {
			t.Fatal(err)
		}
		sessions, onces = append(sessions, s), append(onces, o)
	}
	arm() // faults hit the claims' requests, not the sessions' creation
	var (
		runs    [ftClaimRounds]int
		running int
		last    holdfast.Token
	)
	first := ftClaimSched.Period(time.Now()).Add(ftClaimSched.Every)
	for k := range ftClaimRounds {
		period := first.Add(time.Duration(k) * ftClaimSched.Every)
		var wg sync.WaitGroup
		for i, o := range onces {
			wg.Go(func() {
				if i != k%len(onces) {
					time.Sleep(30 * time.Millisecond)
				}
				wait := 10 * time.Second
				if i == 0 {
					wait = time.Second
				}
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				cl, err := o.ClaimPeriod(ctx, period)
				if err != nil {
					if errors.Is(err, holdfast.ErrPeriodOver) {
						problem("client %d's claim of period %d: %v (the scenario's periods are ahead of the clock)", i, k, err)
					}
					return // a fault may fail any claimant's claim
				}
				mu.Lock()
				runs[k]++
				if running++; running > 1 {
					res.problems = append(res.problems, fmt.Sprintf("client %d runs period %d while %d other run(s) are under way", i, k, running-1))
				}
				if cl.Token() <= last {
					res.problems = append(res.problems, fmt.Sprintf("client %d's token %d for period %d, after %d", i, cl.Token(), k, last))
				}
				last = cl.Token()
				mu.Unlock()
				time.Sleep(30 * time.Millisecond)
				mu.Lock()
				running--
				mu.Unlock()
				uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = cl.Unlock(uctx) // a fault may fail it: the run still ends
			})
		}
		wg.Wait()
	}
	ran, skips := 0, 0
	for k, n := range runs {
		ran += min(n, 1)
		switch {
		case n > 1:
			problem("period %d ran %d times", k, n)
		case n == 0 && mode == etcdtest.Late:
			skips++
		case n == 0:
			problem("liveness: period %d did not run", k)
		}
	}
	res.note = fmt.Sprintf("%d periods, %d run, %d skipped", ftClaimRounds, ran, skips)
	// Nothing left: unused leases removed while the sessions live (a late
	// lease expires by its TTL), then no lease and no key but the record
	// once they are closed.
	f.Wait()
	quit.Wait()
	own := map[clientv3.LeaseID]bool{}
	for _, s := range sessions {
		own[s.Lease()] = true
	}
	bound := core.ClaimCleanup
	if mode == etcdtest.Late {
		bound += ftClaimSched.AtMost + time.Second // and etcd's expiry, every 500 ms
	}
	var left []string
	deadline := time.Now().Add(bound)
	for {
		left = left[:0]
		for id := range leaseIDs(t, admin) {
			if !before[id] && !own[id] {
				left = append(left, fmt.Sprintf("%x", int64(id)))
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			problem("left behind: claim leases %v, %v after the last request", left, bound)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, s := range sessions {
		_ = s.Close()
	}
	deadline = time.Now().Add(2 * time.Second)
	for {
		ks := keys(t, admin, name+"/")
		ls := newLeases(t, admin, before)
		if slices.Equal(ks, []string{name + "/.claim"}) && len(ls) == 0 {
			break
		}
		if time.Now().After(deadline) {
			problem("left behind: keys %v (want the record alone), leases %v", ks, ls)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return res
}

type ftSpan struct{ from, to time.Duration }

// longestGap is the longest interval before end in which fewer than limit
// grants were held while at least one wait was in progress.
func longestGap(waits, held []ftSpan, limit int, end time.Duration) time.Duration {
	type edge struct {
		at       time.Duration
		dw, dh   int
		priority int
	}
	var es []edge
	for _, w := range waits {
		es = append(es, edge{w.from, 1, 0, 0}, edge{w.to, -1, 0, 2})
	}
	for _, h := range held {
		to := h.to
		if to < 0 {
			to = end
		}
		es = append(es, edge{h.from, 0, 1, 1}, edge{to, 0, -1, 3})
	}
	sort.Slice(es, func(i, j int) bool {
		if es[i].at != es[j].at {
			return es[i].at < es[j].at
		}
		return es[i].priority < es[j].priority
	})
	var longest, from time.Duration
	w, h, in := 0, 0, false
	for _, e := range es {
		w, h = w+e.dw, h+e.dh
		gap := w > 0 && h < limit
		if gap && !in {
			from, in = e.at, true
		} else if !gap && in {
			in = false
			longest = max(longest, e.at-from)
		}
	}
	return longest
}

func leaseIDs(t *testing.T, admin *clientv3.Client) map[clientv3.LeaseID]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := admin.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[clientv3.LeaseID]bool{}
	for _, l := range resp.Leases {
		ids[l.ID] = true
	}
	return ids
}

func newLeases(t *testing.T, admin *clientv3.Client, before map[clientv3.LeaseID]bool) []string {
	var out []string
	for id := range leaseIDs(t, admin) {
		if !before[id] {
			out = append(out, fmt.Sprintf("%x", int64(id)))
		}
	}
	return out
}

// Request kinds by shape (see requestKind), per primitive, with the name
// of the step that sends them. A fault-free run must send exactly these
// (the keepalive, timed by the TTL, may or may not come).
const (
	kRelease   = "Txn(if createEQ then [del] else [])"
	kJoin      = "Txn(if createEQ then [get,get,put] else [get])"
	kRead      = "Txn(if createEQ then [get,get] else [])"
	kTake      = "Txn(if createEQ* then [put] else [get,get])"
	kWatch     = "Watch"
	kKeepAlive = "LeaseKeepAlive"
	kRevoke    = "LeaseRevoke"
	kGrant     = "LeaseGrant"
	kClaim     = "Txn(if createEQ,createEQ then [put,put] else [txn(if valueLE,createEQ then [put,put] else [get,get])])"
)

var ftKinds = map[string]map[string]string{
	"mutex": {kJoin: "queue up (join)", kRead: "read after a wake-up (hand off)", kRelease: "release, or leave after giving up",
		kTake: "take (TryLock)", kWatch: "watch the predecessor / the grant", kKeepAlive: "renew", kRevoke: "close the session"},
	"semaphore": {"Txn(if createEQ,valueEQ* then [get,put] else [txn(if createEQ* then [put] else [get,get])])": "permit write (join and count)",
		"Range(prefix)": "take (TryLock's count)", kRelease: "release, or leave after giving up", kWatch: "watch the prefix / the grant",
		kKeepAlive: "renew", kRevoke: "close the session"},
	"rwmutex": {"Txn(if createEQ then [get,get,get,get,get,get,put] else [get])": "queue up to write",
		"Txn(if createEQ then [get,get,get,get,put] else [get])":                                                   "queue up to read",
		"Txn(if createEQ* then [put] else [get,get,get,get])":                                                      "take to write (TryLock)",
		"Txn(if createEQ then [put] else [])":                                                                      "downgrade (the marker)",
		"Txn(if createEQ then [del,txn(if valueEQ then [del] else [])] else [txn(if valueEQ then [del] else [])])": "release a downgraded grant (and its marker)",
		kRelease: "release, or leave after giving up", kWatch: "watch the prefix / the grant", kKeepAlive: "renew", kRevoke: "close the session"},
	"election": {"Txn(if createEQ then [get,get,txn(if createEQ* then [put] else [put])] else [get])": "campaign (join)",
		"Txn(if createEQ then [txn(if createGR* then [put] else [get,get])] else [])": "read after a wake-up, taking office",
		"Txn(if createEQ then [put] else [])":                                         "proclaim", kRelease: "resign, or leave after giving up",
		kWatch: "watch the predecessor / the grant", kKeepAlive: "renew", kRevoke: "close the session"},
	"multi": {kJoin: "queue up (join) per name", kRead: "read after a wake-up (hand off)", kRelease: "release per name, or leave after giving up",
		kTake: "take (TryLock) per name", kWatch: "watch the predecessors / the grants", kKeepAlive: "renew", kRevoke: "close the sessions"},
	// The claim's (see ftClaimScenario), besides its sessions' own streams
	// (their watch, opened as they start, and their renewal), which it does
	// not use and the other rows fault.
	"claim": {kClaim: "claim (record and mark)", kGrant: "grant the claim's lease",
		kRevoke: "revoke the claim's lease (Unlock, or an unused one), close the sessions"},
}

// ftHold is how long the first holders hold.
const ftHold = 600 * time.Millisecond

// ftLateHold is how long a late request whose caller does not give up is
// held.
const ftLateHold = 300 * time.Millisecond

var ftModes = []etcdtest.FaultMode{etcdtest.Refuse, etcdtest.LoseAnswer, etcdtest.Late}

// TestEtcdFaultTable runs the request-fault table (see ftScenario): for
// each primitive, a fault-free run that checks the list of request kinds,
// then one case per kind and mode (Late only for unary requests). By
// default, the mutex's every case and, for the others, one mode per kind
// of request but the session's (renew, close);
// -faults.full (make faults): every case.
func TestEtcdFaultTable(t *testing.T) {
	t.Parallel() // its own etcd, and mostly waiting: beside the other long tests
	c := etcdtest.Etcd(t)
	admin := c.Client(t)
	ran, failed := 0, 0
	for _, p := range ftPrims {
		f := etcdtest.NewFaults()
		quit := etcdtest.NewFaults()
		var mu sync.Mutex
		seen, quitter := map[string]int{}, map[string]bool{}
		r := p.scenario(t, c, admin, f, quit, func() {
			f.Observe(func(method string, req any) {
				mu.Lock()
				seen[requestKind(method, req)]++
				mu.Unlock()
			})
			quit.Observe(func(method string, req any) {
				mu.Lock()
				quitter[requestKind(method, req)] = true
				mu.Unlock()
			})
		}, fmt.Sprintf("ft/%s/none", p.name), 0, 0, ftHold)
		if len(r.problems) > 0 {
			t.Errorf("%s without faults: %v", p.name, r.problems)
		}
		table := ftKinds[p.name]
		var kinds []string
		for k := range table {
			if seen[k] == 0 && k != kKeepAlive {
				t.Errorf("%s: no request of kind %q (%s) in a fault-free run: the table is out of date", p.name, k, table[k])
			}
			kinds = append(kinds, k)
		}
		for k := range seen {
			if _, ok := table[k]; !ok && !(p.claim && (k == kWatch || k == kKeepAlive)) {
				t.Errorf("%s: a fault-free run sent a request of kind %q that the table does not list: add it to ftKinds", p.name, k)
			}
		}
		sort.Strings(kinds)
		for ki, k := range kinds {
			for mi, mode := range ftModes {
				stream := !strings.HasPrefix(k, "Txn") && !strings.HasPrefix(k, "Range") && k != kRevoke && k != kGrant
				if mode == etcdtest.Late && stream {
					continue
				}
				session := k == kKeepAlive || k == kRevoke // the same for every primitive
				if !*faultsFull && p.name != "mutex" && (session || (ki+len(p.name))%len(ftModes) != mi) {
					continue
				}
				id := fmt.Sprintf("%s, %s, %v", p.name, table[k], mode)
				if !strings.Contains(id, *faultsCase) {
					continue
				}
				name := fmt.Sprintf("ft/%s/%d/%v", p.name, ki, mode)
				f, quit := etcdtest.NewFaults(), etcdtest.NewFaults()
				// A late request: the first one of the kind that the
				// contender who gives up at 200 ms sends, held until then;
				// else the first one of the kind, held 300 ms (the bound
				// allows for that delay).
				on, slack := f, time.Duration(0)
				if mode == etcdtest.Late {
					if quitter[k] {
						on = quit
					} else {
						slack = ftLateHold
					}
				}
				hold := ftHold
				if k == kKeepAlive {
					hold = ftTTL / 2 // a renewal comes while they hold
				}
				var hit func() bool
				start := time.Now()
				r := p.scenario(t, c, admin, f, quit, func() {
					hit = on.Inject(etcdtest.Rule{Mode: mode, Hold: ftLateHold, Match: func(method string, req any) bool { return requestKind(method, req) == k }})
				}, name, mode, slack, hold)
				ran++
				verdict := "ok"
				if !hit() {
					r.problems = append(r.problems, "the fault never hit: the case tests nothing")
				}
				if len(r.problems) > 0 {
					failed++
					verdict = "FAILED"
					t.Errorf("%s, %s (%s), %v: %v", p.name, table[k], k, mode, r.problems)
				}
				if r.note != "" {
					verdict += ", " + r.note
				}
				t.Logf("case %s, %s, %v: %s (fault hit: %v, session lost: %v, %v)", p.name, table[k], mode, verdict, hit(), r.lost, time.Since(start).Round(time.Millisecond))
			}
		}
	}
	t.Logf("request-fault table: %d cases run, %d failed", ran, failed)
	fmt.Printf("etcd request-fault table: %d cases run, %d failed\n", ran, failed)
}
