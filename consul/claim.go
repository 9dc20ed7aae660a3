package consul

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// ClaimFlags marks a claim key ("<name>/.claim") in Consul's KV flags.
const ClaimFlags uint64 = 0x686f6c64636c6d01

// Once is a once-per-period claim on Consul: the first claimant of a period
// runs, every other one is refused at once with an error wrapping
// holdfast.ErrClaimed (see holdfast.Schedule). Its keys, flagged ClaimFlags:
// the record "<name>/.claim" (the last period claimed; it stays) and the
// run's mark "<name>/.run", held by a claim session of its own (TTL
// AtMost/2, never renewed). docs/DESIGN.md, "Once-per-period claims".
type Once struct {
	s      *Session
	name   string
	record string // <name>/.claim
	run    string // <name>/.run
	sched  holdfast.Schedule
}

// NewOnce returns the claim called name, made through s on schedule sched,
// whose AtMost must lie between 2 x MinTTL and 2 x MaxTTL (else an error
// wrapping holdfast.ErrInvalidArgument).
func NewOnce(s *Session, name string, sched holdfast.Schedule) (*Once, error) {
	if err := core.CheckOnce(s != nil, name, sched, 2*MinTTL, 2*MaxTTL); err != nil {
		return nil, err
	}
	return &Once{s: s, name: name, record: name + "/.claim", run: name + "/.run", sched: sched}, nil
}

// Claim claims the period that the wall clock is in now.
func (o *Once) Claim(ctx context.Context) (*Claim, error) {
	return o.ClaimPeriod(ctx, o.sched.Period(time.Now()))
}

// ClaimPeriod claims the period that starts at period. It returns the
// claim, or at once an error wrapping holdfast.ErrClaimed if the record
// holds this period or a later one or a run holds the mark, and one
// wrapping holdfast.ErrPeriodOver (and ErrClaimed) if period+Every had
// passed when it was called or answered (the period is then recorded). It
// costs a read, a session creation and a transaction, bounded by ctx.
func (o *Once) ClaimPeriod(ctx context.Context, period time.Time) (c *Claim, err error) {
	period, err = core.CheckPeriod(ctx, period)
	if err != nil {
		return nil, err
	}
	if claimPeriodOver(period, o.sched.Every, time.Now()) {
		return nil, core.PeriodOver(o.name, period, o.sched.Every)
	}
	if err := o.s.alive(); err != nil {
		return nil, fmt.Errorf("holdfast/consul: claim %s: %w", o.name, err)
	}
	ctx, stop := core.Bind(ctx, o.s.keeper.Context())
	defer stop()
	var id string // the run's session, once created: destroyed on failure
	defer func() {
		if err != nil && id != "" {
			core.Dispose(ctx, o.s.bg, core.Backoff{Attempt: core.AttemptTimeout}, 0, func(ctx context.Context) error { return o.destroy(ctx, id) })
		}
	}()
	var sent time.Time
	for {
		// 1. read the record: refused if it holds period or a later one
		rec, err := o.s.get(ctx, o.record, true)
		if err != nil {
			return nil, o.fail(ctx, err)
		}
		if err := claimRecordGuard(o, period, rec); err != nil {
			return nil, err
		}
		// 2. a session for the run's mark
		if id == "" {
			sent = time.Now()
			if id, err = o.session(ctx, o.sched.AtMost/2); err != nil {
				return nil, o.fail(ctx, err)
			}
		}
		// 3. record and mark in one transaction
		token, err := o.mark(ctx, id, period, rec)
		got := time.Now()
		switch {
		case errors.Is(err, errRecordMoved):
			continue
		case err != nil:
			return nil, err
		case claimPeriodOver(period, o.sched.Every, got):
			return nil, core.PeriodOver(o.name, period, o.sched.Every)
		}
		c = &Claim{o: o, id: id, period: period, made: got}
		c.base = core.ClaimGrant(o.s.keeper, o.s.bg, o.run, holdfast.Token(token), sent, o.sched.AtMost/2, core.ReleaseFunc(c.release))
		return c, nil
	}
}

var errRecordMoved = errors.New("holdfast/consul: the claim record moved")

// mark sets the record to period by a cas on rec's index and acquires the
// run's mark with session id if no run holds it, in one transaction, and
// returns the record's new index (the token): errRecordMoved if the record
// moved since rec, holdfast.ErrClaimed if a run holds the mark. Without an
// answer, it reads the mark: held by id, the transaction applied.
func (o *Once) mark(ctx context.Context, id string, period time.Time, rec *api.KVPair) (uint64, error) {
	var index uint64
	if rec != nil {
		index = rec.ModifyIndex
	}
	val := []byte(core.FormatPeriod(period))
	resp, err := o.s.txn(ctx, api.TxnOps{
		&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: o.record, Flags: ClaimFlags, Index: index, Value: val}},
		kvOp(api.KVCheckNotExists, o.run),
		&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: o.run, Flags: ClaimFlags, Session: id, Value: val}},
	})
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.denied():
		return 0, txnError("claim "+o.name, rb)
	case rb != nil && rb.failed(1):
		return 0, o.running(ctx, period)
	case rb != nil && rb.failed(0):
		return 0, errRecordMoved
	case err != nil:
		if e, rerr := o.s.get(ctx, o.run, true); rerr == nil && e != nil && e.Session == id {
			return e.ModifyIndex, nil // the transaction's index, the record's too
		}
		return 0, o.fail(ctx, err)
	}
	for _, r := range resp.Results {
		if r.KV != nil && r.KV.Key == o.record {
			return r.KV.ModifyIndex, nil
		}
	}
	return 0, fmt.Errorf("holdfast/consul: claim %s: no index for %s in the transaction's answer", o.name, o.record)
}

// session creates a claim session: TTL ttl, behavior delete, lock-delay 0,
// no checks, named "holdfast claim <name> <random text>", so that one whose
// creation had no answer is taken (createSession) or, if it may be applied
// later, found and destroyed within ttl.
func (o *Once) session(ctx context.Context, ttl time.Duration) (string, error) {
	name := "holdfast claim " + o.name + " " + rand.Text()
	id, _, err := createSession(ctx, o.s.client, name, map[string]any{"TTL": ttl.String(), "LockDelay": "0ms", "Behavior": api.SessionBehaviorDelete, "NodeChecks": []string{}})
	if answerLost(err) {
		core.Dispose(ctx, o.s.bg, core.Backoff{Attempt: core.AttemptTimeout, Max: 5 * time.Second}, ttl, func(ctx context.Context) error {
			id, err := sessionNamed(ctx, o.s.client, name)
			if err != nil || id == "" { // none yet: its creation may still be applied
				return cmp.Or(err, errors.New("holdfast/consul: no session "+name+" yet"))
			}
			return o.destroy(ctx, id)
		})
	}
	return id, err
}

// destroy destroys the claim session id: nil if it is gone.
func (o *Once) destroy(ctx context.Context, id string) error {
	_, err := o.s.client.Session().Destroy(id, writeOpts(ctx))
	if err != nil && statusCode(err) != http.StatusNotFound {
		return apiError("destroy claim session", err)
	}
	return nil
}

// refusedBy is the error of a claim of period that the record rec (nil:
// absent) refuses, or nil.
func (o *Once) refusedBy(period time.Time, rec *api.KVPair) error {
	if rec == nil {
		return nil
	}
	what := fmt.Sprintf("%s for period %s", o.name, period.Format(time.RFC3339))
	last, ok := core.ParsePeriod(rec.Value)
	switch {
	case !ok || rec.Session != "":
		return fmt.Errorf("%w: %s: %s holds a claim of an older holdfast (%q) until its session ends", holdfast.ErrClaimed, what, o.record, rec.Value)
	case !last.Before(period):
		return fmt.Errorf("%w: %s: period %s was claimed (token %d)", holdfast.ErrClaimed, what, last.Format(time.RFC3339), rec.ModifyIndex)
	}
	return nil
}

// running is the error of a claim of period refused because a run holds
// the mark, which it reads (best effort) to say which.
func (o *Once) running(ctx context.Context, period time.Time) error {
	what := fmt.Sprintf("%s for period %s", o.name, period.Format(time.RFC3339))
	e, err := o.s.get(ctx, o.run, true)
	if err != nil || e == nil {
		return fmt.Errorf("%w: %s: a run still holds", holdfast.ErrClaimed, what)
	}
	rp, _ := core.ParsePeriod(e.Value)
	return fmt.Errorf("%w: %s: the run of period %s (token %d) still holds", holdfast.ErrClaimed, what, rp.Format(time.RFC3339), e.ModifyIndex)
}

// fail is the error of a failed claim: the session's end, ctx's, or err.
func (o *Once) fail(ctx context.Context, err error) error {
	return core.ClaimFail(ctx, "holdfast/consul: claim "+o.name, o.s.alive(), err)
}

// Claim is a held once-per-period claim, a holdfast.Grant: its key is the
// run's mark "<name>/.run", its token the ModifyIndex of the transaction
// that claimed the period. Its context ends with ErrReleased on Unlock, and
// with an error wrapping holdfast.ErrLost at its deadline or the session's
// end.
type Claim struct {
	base   *core.Grant
	o      *Once
	id     string // the claim's own session
	period time.Time
	made   time.Time // when the answer of the claiming request arrived
}

var _ holdfast.Grant = (*Claim)(nil)

// Key implements holdfast.Grant: "<name>/.run".
func (c *Claim) Key() string { return c.base.Key() }

// Token implements holdfast.Grant.
func (c *Claim) Token() holdfast.Token { return c.base.Token() }

// Period returns the start of the period claimed.
func (c *Claim) Period() time.Time { return c.period }

// Context implements holdfast.Grant.
func (c *Claim) Context() context.Context { return c.base.Context() }

// Deadline implements holdfast.Grant: when the claim's session was asked
// for, plus 4/5 of its TTL (AtMost/2). A run must finish by then.
func (c *Claim) Deadline() time.Time { return c.base.Deadline() }

// Unlock implements holdfast.Grant: the run is over. It waits until AtLeast
// has passed since the claim was made (or the deadline, or ctx's end), then
// destroys the claim's session, which deletes the run's mark (if ctx ends
// first, in the background).
func (c *Claim) Unlock(ctx context.Context) error {
	return core.UnlockClaim(ctx, c.base, c.made.Add(c.o.sched.AtLeast))
}

// Guard returns the operation that succeeds exactly while the claim is held.
func (c *Claim) Guard() api.TxnOps { return api.TxnOps{checkSession(c.o.run, c.id)} }

// Txn runs ops in one transaction that applies only while the claim is held
// (Guard first), as Grant.Txn; ops may not touch the keys under "<name>/.".
func (c *Claim) Txn(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	return c.o.s.heldTxn(ctx, c.base, c.o.name+"/.", claimGuard(c), ops, "claim session "+c.id)
}

// release destroys the claim's session (one attempt, which the core bounds
// and retries), which deletes the run's mark.
func (c *Claim) release(ctx context.Context) error { return c.o.destroy(ctx, c.id) }
