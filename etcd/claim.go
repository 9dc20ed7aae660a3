package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// minClaimTTL is the shortest lease etcd grants (its minimum TTL with the
// default election timeout): AtMost may not be shorter.
const minClaimTTL = 2 * time.Second

// Once is a once-per-period claim on etcd: the first claimant of a period
// runs, every other claimant is refused at once with an error wrapping
// holdfast.ErrClaimed (see holdfast.Schedule for AtLeast, AtMost and the
// periods).
//
// Two keys: the record "<name>/.claim", without a lease, whose value is the
// last period claimed (it stays when the run ends: the one key a claim
// leaves, about 30 bytes), and the run's mark "<name>/.run", with a lease of
// its own (TTL AtMost, rounded up to whole seconds, never renewed, revoked
// by Unlock). A claim is one transaction after the lease grant: it writes
// both keys if the record is absent or older than its period and no run is
// marked. So a period is claimed once whatever the delays, and a run that
// outlasts its period makes the next ones skip, until it ends or AtMost
// frees its mark.
//
// A claim key of an older holdfast ("<name>/.claim" with a lease and a JSON
// value) refuses every claim until its lease ends (AtMost); the record then
// replaces it. An older holdfast is refused for ever once a record exists:
// upgrade every replica of a name together.
type Once struct {
	s      *Session
	name   string
	record string // <name>/.claim
	run    string // <name>/.run
	sched  holdfast.Schedule
}

// NewOnce returns the claim called name, made through session s on
// schedule sched. The name follows holdfast.ValidateName. sched.AtMost must
// be at least 2 s (etcd's shortest lease); otherwise, or if sched is not
// valid, the error wraps holdfast.ErrInvalidArgument.
func NewOnce(s *Session, name string, sched holdfast.Schedule) (*Once, error) {
	if err := core.CheckOnce(s != nil, name, sched, minClaimTTL, maxTTL); err != nil {
		return nil, err
	}
	return &Once{s: s, name: name, record: name + "/.claim", run: name + "/.run", sched: sched}, nil
}

// Claim claims the period that this process's wall clock is in now
// (Schedule.Period(time.Now())).
func (o *Once) Claim(ctx context.Context) (*Claim, error) {
	return o.ClaimPeriod(ctx, o.sched.Period(time.Now()))
}

// ClaimPeriod claims the period that starts at period. It returns the
// claim, or at once an error wrapping holdfast.ErrClaimed if the record
// holds this period or a later one, or a run is marked; one wrapping
// holdfast.ErrPeriodOver (and ErrClaimed) if period+Every had passed when
// it was called (no request) or when the answer came (the period is then
// recorded, and skipped). ctx bounds the requests: a lease grant and one
// transaction. A lease that ends up unused is revoked before it returns
// (bounded; else in the background while the session lives, and by its
// TTL anyway).
func (o *Once) ClaimPeriod(ctx context.Context, period time.Time) (*Claim, error) {
	period, err := core.CheckPeriod(ctx, period)
	if err != nil {
		return nil, err
	}
	if claimPeriodOver(period, o.sched.Every, time.Now()) {
		return nil, core.PeriodOver(o.name, period, o.sched.Every)
	}
	if err := o.s.alive(); err != nil {
		return nil, fmt.Errorf("holdfast/etcd: claim %s: %w", o.name, err)
	}
	ctx, stop := core.Bind(ctx, o.s.keeper.Context())
	defer stop()
	cli := o.s.client
	ttl := (o.sched.AtMost + time.Second - 1) / time.Second * time.Second
	sent := time.Now()
	lease, granted, err := grantLease(ctx, o.s.client, ttl)
	if err != nil {
		o.revoke(ctx, lease) // it may have been granted without an answer
		return nil, o.fail(ctx, "grant the claim's lease", err)
	}
	p := core.FormatPeriod(period)
	write := []clientv3.Op{clientv3.OpPut(o.record, p), clientv3.OpPut(o.run, p, clientv3.WithLease(lease))}
	noRun := clientv3.Compare(clientv3.CreateRevision(o.run), "=", 0)
	// 1. no record and no run: claim; 2. else a record older than period
	// (a missing key's value compares false) and no run: claim; 3. else
	// read both, to say why not.
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(o.record), "=", 0), noRun).
		Then(write...).
		Else(clientv3.OpTxn(
			append(claimRecordGuard(o.record, p), noRun),
			write,
			[]clientv3.Op{clientv3.OpGet(o.record), clientv3.OpGet(o.run)})).
		Commit()
	got := time.Now()
	token, err := o.outcome(ctx, period, lease, resp, err)
	if err == nil && claimPeriodOver(period, o.sched.Every, got) {
		err = core.PeriodOver(o.name, period, o.sched.Every)
	}
	if err != nil {
		o.revoke(ctx, lease)
		return nil, err
	}
	c := &Claim{o: o, lease: lease, period: period, made: got}
	c.base = core.ClaimGrant(o.s.keeper, o.s.bg, o.run, holdfast.Token(token), sent, granted, core.ReleaseFunc(c.release))
	return c, nil
}

// outcome is the token of the claim transaction (resp, err), or why it did
// not claim. Without an answer, it reads the run's mark (within
// core.ClaimCleanup): carrying lease, the transaction applied, at the
// mark's create revision.
func (o *Once) outcome(ctx context.Context, period time.Time, lease clientv3.LeaseID, resp *clientv3.TxnResponse, err error) (int64, error) {
	if err != nil {
		rctx, cancel := context.WithTimeout(ctx, core.ClaimCleanup)
		defer cancel()
		if g, gerr := o.s.client.Get(rctx, o.run); gerr == nil && len(g.Kvs) == 1 && clientv3.LeaseID(g.Kvs[0].Lease) == lease {
			return g.Kvs[0].CreateRevision, nil
		}
		return 0, o.fail(ctx, "claim", err)
	}
	if !resp.Succeeded {
		inner := resp.Responses[0].GetResponseTxn()
		if !inner.GetSucceeded() {
			return 0, o.refused(period, first(inner.GetResponses()[0]), first(inner.GetResponses()[1]))
		}
	}
	return resp.Header.Revision, nil
}

// refused is the error of a claim of period refused because of the record
// rec and the run mark run (either may be nil).
func (o *Once) refused(period time.Time, rec, run *mvccpb.KeyValue) error {
	what := fmt.Sprintf("%s for period %s", o.name, period.Format(time.RFC3339))
	last, ok := time.Time{}, false
	if rec != nil {
		last, ok = core.ParsePeriod(rec.Value)
	}
	switch {
	case rec != nil && !ok:
		return fmt.Errorf("%w: %s: %s holds a claim of an older holdfast (%q) until its lease ends", holdfast.ErrClaimed, what, o.record, rec.Value)
	case rec != nil && !last.Before(period):
		return fmt.Errorf("%w: %s: period %s was claimed (token %d)", holdfast.ErrClaimed, what, last.Format(time.RFC3339), rec.ModRevision)
	case run != nil:
		rp, _ := core.ParsePeriod(run.Value)
		return fmt.Errorf("%w: %s: the run of period %s (token %d) still holds", holdfast.ErrClaimed, what, rp.Format(time.RFC3339), run.CreateRevision)
	}
	return fmt.Errorf("%w: %s", holdfast.ErrClaimed, what) // changed between the compares and the reads: cannot be (one txn)
}

// fail is the error of a failed claim's step what: the session's end,
// ctx's error, or the store's.
func (o *Once) fail(ctx context.Context, what string, err error) error {
	return core.ClaimFail(ctx, "holdfast/etcd: claim "+o.name+": "+what, o.s.alive(), storeErr(err))
}

// revoke revokes lease, a claim's that it did not use (see core.Dispose):
// retried in the background while the session lives.
func (o *Once) revoke(ctx context.Context, lease clientv3.LeaseID) {
	core.Dispose(ctx, o.s.bg, core.Backoff{Attempt: core.AttemptTimeout}, 0, func(ctx context.Context) error { return revokeOnce(ctx, o.s.client, lease) })
}

// revokeOnce revokes lease: nil if it is gone.
func revokeOnce(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID) error {
	_, err := cli.Revoke(ctx, lease)
	if err != nil && errors.Is(storeErr(err), holdfast.ErrSessionLost) {
		return nil // already gone
	}
	return storeErr(err)
}

// Claim is a held once-per-period claim. It implements holdfast.Grant: its
// key is the run's mark "<name>/.run", its token the revision of the
// transaction that claimed the period (the record's and the mark's
// revision: tokens of successive claims of a name increase). Its context
// ends with ErrReleased on Unlock, and with an error wrapping
// holdfast.ErrLost at its safe deadline (see Deadline) or when the session
// ends.
type Claim struct {
	base   *core.Grant
	o      *Once
	lease  clientv3.LeaseID
	period time.Time
	made   time.Time // when the answer of the claiming request arrived
}

var _ holdfast.Grant = (*Claim)(nil)

// Key implements holdfast.Grant: "<name>/.run".
func (c *Claim) Key() string { return c.base.Key() }

// Token implements holdfast.Grant: the revision of the claiming
// transaction (Key's create revision).
func (c *Claim) Token() holdfast.Token { return c.base.Token() }

// Period returns the start of the period claimed.
func (c *Claim) Period() time.Time { return c.period }

// Context implements holdfast.Grant.
func (c *Claim) Context() context.Context { return c.base.Context() }

// Deadline implements holdfast.Grant: the moment the claim request was sent
// plus AtMost (as granted, whole seconds) minus a fifth of it. The claim is
// never renewed: a run must finish by then.
func (c *Claim) Deadline() time.Time { return c.base.Deadline() }

// Unlock implements holdfast.Grant: the run is over. It first waits until
// AtLeast has passed since the claim was made (or the deadline, or ctx
// ends), then revokes the claim's lease, which removes the run's mark:
// nothing of the claim is left but the record. If ctx ends first, the
// revocation goes on in the background while the session lives, and the
// mark ends with the lease (AtMost) otherwise.
func (c *Claim) Unlock(ctx context.Context) error {
	return core.UnlockClaim(ctx, c.base, c.made.Add(c.o.sched.AtLeast))
}

// Guard returns the comparison that holds exactly while this claim is held
// in etcd: the run's mark carries the claim's own lease (which no other
// claim uses). Txn puts it in the If for you.
func (c *Claim) Guard() clientv3.Cmp {
	return clientv3.Compare(clientv3.LeaseValue(c.o.run), "=", c.lease)
}

// Txn runs ops in one etcd transaction that commits only while the claim is
// held (its If is Guard). If the claim ended (locally or in etcd), it
// applies nothing and returns an error wrapping holdfast.ErrNotHeld. ops
// may not touch the claim's keys ("<name>/.claim", "<name>/.run"): such ops
// are refused with an error wrapping holdfast.ErrInvalidArgument before any
// request.
func (c *Claim) Txn(ctx context.Context, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	g := Grant{pfx: c.o.name + "/."}
	if err := g.checkOps(ops); err != nil {
		return nil, err
	}
	if !c.base.Held() {
		return nil, c.base.NotHeld()
	}
	resp, err := c.o.s.client.Txn(ctx).If(claimGuard(c)...).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("holdfast/etcd: guarded txn on %s: %w", c.Key(), storeErr(err))
	}
	if !resp.Succeeded {
		c.base.Lose(fmt.Errorf("%w: %s no longer carries the claim's lease %x", holdfast.ErrLost, c.Key(), int64(c.lease)))
		return nil, c.base.NotHeld()
	}
	return resp, nil
}

// release ends the run in etcd (one attempt; the core retries it): it
// revokes the claim's lease, which deletes the run's mark and nothing else.
func (c *Claim) release(ctx context.Context) error {
	return revokeOnce(ctx, c.o.s.client, c.lease)
}
