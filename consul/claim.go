package consul

import (
	"context"
	"encoding/json"
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
// runs, every other claimant is refused at once with an error wrapping
// holdfast.ErrClaimed (see holdfast.Schedule for AtLeast, AtMost and the
// periods).
//
// The claim is the key "<name>/.claim", created only if absent and acquired
// by a Consul session of its own (never renewed, TTL AtMost/2, behavior
// delete, lock-delay 0, no health checks): Consul invalidates a session
// between TTL and 2 x TTL after it was created, so a claim whose holder died
// is gone by AtMost (later only if a leader election re-arms the timer). The
// holdfast Session only carries the requests. While any claim of the name
// exists, every claim of the name is refused, whatever its period: a run
// that outlasts its period makes the next ones skip.
type Once struct {
	s     *Session
	name  string
	key   string
	sched holdfast.Schedule
}

// NewOnce returns the claim called name, made through session s on
// schedule sched. The name follows holdfast.ValidateName. sched.AtMost must
// lie between 2 x MinTTL (20 s) and 2 x MaxTTL; otherwise, or if sched is
// not valid, the error wraps holdfast.ErrInvalidArgument.
func NewOnce(s *Session, name string, sched holdfast.Schedule) (*Once, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil session", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, err
	}
	if err := sched.Validate(); err != nil {
		return nil, err
	}
	if sched.AtMost < 2*MinTTL || sched.AtMost > 2*MaxTTL {
		return nil, fmt.Errorf("%w: AtMost %v is not between %v and %v (twice Consul's session TTL bounds)", holdfast.ErrInvalidArgument, sched.AtMost, 2*MinTTL, 2*MaxTTL)
	}
	return &Once{s: s, name: name, key: name + "/.claim", sched: sched}, nil
}

// Name returns the claim's name.
func (o *Once) Name() string { return o.name }

// Schedule returns the claim's schedule.
func (o *Once) Schedule() holdfast.Schedule { return o.sched }

// Claim claims the period that this process's wall clock is in now
// (Schedule.Period(time.Now())).
func (o *Once) Claim(ctx context.Context) (*Claim, error) {
	return o.ClaimPeriod(ctx, o.sched.Period(time.Now()))
}

// claimRecord is the value of a claim key.
type claimRecord struct {
	Period time.Time `json:"period"`
}

// ClaimPeriod claims the period that starts at period (only recorded and
// reported: exclusion is per name). It returns the claim, or an error
// wrapping holdfast.ErrClaimed at once if the name's claim is taken: one
// session creation and one transaction (check-not-exists, lock). ctx bounds
// both. Whatever a failed attempt created is removed by destroying its
// session, in the background if need be.
func (o *Once) ClaimPeriod(ctx context.Context, period time.Time) (*Claim, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if err := o.s.alive(); err != nil {
		return nil, fmt.Errorf("holdfast/consul: claim %s: %w", o.name, err)
	}
	ctx, stop := o.s.bind(ctx)
	defer stop()
	ttl := o.sched.AtMost / 2
	sent := time.Now()
	id, err := o.session(ctx, ttl)
	if err != nil {
		return nil, o.fail(ctx, err)
	}
	val, _ := json.Marshal(claimRecord{Period: period.UTC()})
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	resp, err := o.s.txn(rctx, api.TxnOps{
		kvOp(api.KVCheckNotExists, o.key),
		&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: o.key, Flags: ClaimFlags, Session: id, Value: val}},
	})
	cancel()
	got := time.Now()
	var rb *rollback
	switch {
	case errors.As(err, &rb) && !rb.denied():
		o.destroy(id)
		return nil, o.refused(ctx, period)
	case errors.As(err, &rb):
		o.destroy(id)
		return nil, txnError("claim "+o.name, rb)
	case err != nil:
		o.destroy(id)
		return nil, o.fail(ctx, err)
	}
	var index uint64
	for _, r := range resp.Results {
		if r.KV != nil && r.KV.Key == o.key {
			index = r.KV.ModifyIndex
		}
	}
	if index == 0 {
		o.destroy(id)
		return nil, fmt.Errorf("holdfast/consul: claim %s: no index for %s in the transaction's answer", o.name, o.key)
	}
	c := &Claim{o: o, id: id, index: index, period: period.UTC(), value: val, made: got}
	keeper := core.NewKeeper(sent, ttl, ttl/5)
	endWithSession := context.AfterFunc(o.s.keeper.Context(), func() { keeper.End(context.Cause(o.s.keeper.Context())) })
	c.base = core.NewGrant(keeper, o.s.bg, o.key, holdfast.Token(index), c.release, func() {
		endWithSession()
		keeper.End(holdfast.ErrReleased) // stops its timer; the grant ended already
	})
	return c, nil
}

// session creates a claim session: TTL ttl, behavior delete, lock-delay 0,
// no health checks.
func (o *Once) session(ctx context.Context, ttl time.Duration) (string, error) {
	body := map[string]any{
		"Name":       "holdfast claim " + o.name,
		"TTL":        ttl.String(),
		"LockDelay":  "0ms",
		"Behavior":   api.SessionBehaviorDelete,
		"NodeChecks": []string{},
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var out struct{ ID string }
	if _, err := o.s.client.Raw().Write("/v1/session/create", body, &out, writeOpts(ctx)); err != nil {
		return "", apiError("create claim session", err)
	}
	if out.ID == "" {
		return "", errors.New("holdfast/consul: create claim session: empty session ID in the answer")
	}
	return out.ID, nil
}

// destroy destroys the claim session id in the session's background,
// retrying while the holdfast session lives (the claim session expires by
// itself anyway). Behavior delete removes the keys it holds.
func (o *Once) destroy(id string) {
	o.s.bg.Go(func(ctx context.Context) {
		_ = core.Retry(ctx, func(ctx context.Context) error {
			_, err := o.s.client.Session().Destroy(id, writeOpts(ctx))
			if statusCode(err) == http.StatusNotFound {
				return nil
			}
			return err
		})
	})
}

// refused is the error of a claim refused because the key exists; it reads
// the key (best effort, within ctx) to say which period holds it.
func (o *Once) refused(ctx context.Context, period time.Time) error {
	p := period.UTC().Format(time.RFC3339)
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	e, _, err := o.s.client.KV().Get(o.key, (&api.QueryOptions{}).WithContext(rctx))
	var rec claimRecord
	if err != nil || e == nil || json.Unmarshal(e.Value, &rec) != nil {
		return fmt.Errorf("%w: %s for period %s", holdfast.ErrClaimed, o.name, p)
	}
	if rec.Period.Equal(period) {
		return fmt.Errorf("%w: %s for period %s (index %d)", holdfast.ErrClaimed, o.name, p, e.ModifyIndex)
	}
	return fmt.Errorf("%w: %s for period %s: the claim of period %s (index %d) still holds", holdfast.ErrClaimed, o.name, p, rec.Period.Format(time.RFC3339), e.ModifyIndex)
}

// fail is the error of a failed claim: the session's end, ctx's error, or
// the store's.
func (o *Once) fail(ctx context.Context, err error) error {
	if serr := o.s.alive(); serr != nil {
		return fmt.Errorf("holdfast/consul: claim %s: %w", o.name, serr)
	}
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("holdfast/consul: claim %s: %w (%v)", o.name, ctx.Err(), err)
	}
	return fmt.Errorf("holdfast/consul: claim %s: %w", o.name, err)
}

// Claim is a held once-per-period claim. It implements holdfast.Grant: its
// key is "<name>/.claim", its token the ModifyIndex of the write that
// acquired it (tokens of successive claims of a name increase). Its context
// ends with ErrReleased on Unlock, and with an error wrapping
// holdfast.ErrLost at its safe deadline (see Deadline) or when the session
// ends.
type Claim struct {
	base   *core.Grant
	o      *Once
	id     string // the claim's own session
	index  uint64
	period time.Time
	value  []byte
	made   time.Time // when the answer of the acquiring request arrived
	keep   string    // the session that keeps the key until AtLeast (release)
}

var _ holdfast.Grant = (*Claim)(nil)

// Key implements holdfast.Grant: "<name>/.claim".
func (c *Claim) Key() string { return c.base.Key() }

// Token implements holdfast.Grant.
func (c *Claim) Token() holdfast.Token { return c.base.Token() }

// Period returns the start of the period claimed.
func (c *Claim) Period() time.Time { return c.period }

// Session returns the ID of the claim's own Consul session.
func (c *Claim) Session() string { return c.id }

// Context implements holdfast.Grant.
func (c *Claim) Context() context.Context { return c.base.Context() }

// Deadline implements holdfast.Grant: the moment the claim request was sent
// plus AtMost/2 (the claim session's TTL, the earliest Consul may
// invalidate it) minus a fifth of that. The claim is never renewed: a run
// must finish by then.
func (c *Claim) Deadline() time.Time { return c.base.Deadline() }

// Unlock implements holdfast.Grant: the run is over. If AtLeast has not
// passed since the claim was made, the key is handed, in one transaction
// guarded by check-session, to a new session of TTL max(MinTTL, the rest of
// AtLeast), which the holdfast session destroys (deleting the key) when
// AtLeast has passed, or, if this process is gone by then, Consul
// invalidates between one and two TTLs later; otherwise the key is deleted
// (guarded likewise). Then the claim's own session is destroyed.
func (c *Claim) Unlock(ctx context.Context) error { return c.base.Unlock(ctx) }

// Guard returns the operation that succeeds exactly while this claim is
// held: a check-session of its key on the claim's own session.
func (c *Claim) Guard() api.TxnOps { return api.TxnOps{checkSession(c.o.key, c.id)} }

// Txn runs ops in one Consul transaction that applies only while the claim
// is held (Guard first). If the claim ended (locally or in Consul), nothing
// is applied and the error wraps holdfast.ErrNotHeld. ops may not touch the
// claim's key (refused with an error wrapping holdfast.ErrInvalidArgument
// before any request), nor be empty or more than MaxTxnOps-1. On success
// the response's Results are those of ops.
func (c *Claim) Txn(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	g := Grant{prefix: c.o.key}
	if err := g.checkOps(ops); err != nil {
		return nil, err
	}
	if !c.base.Held() {
		return nil, c.base.NotHeld()
	}
	guard := claimGuard(c)
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := c.o.s.txn(ctx, append(guard, ops...))
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.failedBefore(len(guard)):
		if rb.denied() {
			return nil, txnError("guarded transaction on "+c.Key(), rb)
		}
		c.base.Lose(fmt.Errorf("%w: %s is no longer held by claim session %s", holdfast.ErrLost, c.Key(), c.id))
		return nil, c.base.NotHeld()
	case rb != nil:
		for _, e := range resp.Errors {
			e.OpIndex -= len(guard)
		}
		return resp, txnError("guarded transaction on "+c.Key(), rb)
	case err != nil:
		return nil, err
	}
	if len(resp.Results) >= len(guard) {
		resp.Results = resp.Results[len(guard):]
	}
	return resp, nil
}

// release ends the claim in Consul (one attempt; the core retries it).
func (c *Claim) release(ctx context.Context) error {
	remaining := c.o.sched.AtLeast - time.Since(c.made)
	ops := api.TxnOps{checkSession(c.o.key, c.id)}
	if remaining > 0 && c.keep == "" {
		ttl := max(MinTTL, (remaining+time.Second-1)/time.Second*time.Second)
		id, err := c.o.session(ctx, ttl)
		if err != nil {
			return err
		}
		c.keep = id
	}
	if c.keep != "" {
		ops = append(ops,
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: c.o.key, Flags: ClaimFlags, Session: c.id, Value: c.value}},
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: c.o.key, Flags: ClaimFlags, Session: c.keep, Value: c.value}})
	} else {
		ops = append(ops, kvOp(api.KVDelete, c.o.key))
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	_, err := c.o.s.txn(rctx, ops)
	cancel()
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.denied():
		return txnError("release claim "+c.o.name, rb)
	case errors.As(err, &rb):
		// An earlier attempt may have applied: the key is then the keeper's.
		e, _, gerr := c.o.s.client.KV().Get(c.o.key, (&api.QueryOptions{}).WithContext(ctx))
		if gerr != nil {
			return apiError("read claim "+c.o.name, gerr)
		}
		if c.keep == "" || e == nil || e.Session != c.keep {
			if c.keep != "" {
				c.o.destroy(c.keep)
			}
			c.o.destroy(c.id)
			return fmt.Errorf("%w: %s is no longer held by claim session %s", holdfast.ErrNotHeld, c.Key(), c.id)
		}
	case err != nil:
		return err
	}
	c.o.destroy(c.id)
	if keep := c.keep; keep != "" {
		c.o.s.bg.Go(func(ctx context.Context) { c.expire(ctx, keep) })
	}
	return nil
}

// expire ends the claim's keeping session keep once AtLeast has passed since
// the claim was made (its key goes with it: behavior delete), while the
// holdfast session lives; otherwise Consul invalidates keep by its TTL.
func (c *Claim) expire(ctx context.Context, keep string) {
	if !sleep(ctx, time.Until(c.made.Add(c.o.sched.AtLeast))) {
		return
	}
	_ = core.Retry(ctx, func(ctx context.Context) error {
		_, err := c.o.s.client.Session().Destroy(keep, writeOpts(ctx))
		if statusCode(err) == http.StatusNotFound {
			return nil
		}
		return err
	})
}
