package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
// The claim is the key "<name>/.claim", created only if absent, with a lease
// of its own (TTL AtMost, rounded up to whole seconds, never renewed): it
// does not depend on the session's lease, which only carries the requests.
// Its value records the period (JSON). While any claim of the name exists,
// every claim of the name is refused, whatever its period: a run that
// outlasts its period makes the next ones skip, until AtMost frees the key.
type Once struct {
	s     *Session
	name  string
	key   string
	sched holdfast.Schedule
}

// NewOnce returns the claim called name, made through session s on
// schedule sched. The name follows holdfast.ValidateName. sched.AtMost must
// be at least 2 s (etcd's shortest lease); otherwise, or if sched is not
// valid, the error wraps holdfast.ErrInvalidArgument.
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
	if sched.AtMost < minClaimTTL {
		return nil, fmt.Errorf("%w: AtMost %v is shorter than etcd's shortest lease, %v", holdfast.ErrInvalidArgument, sched.AtMost, minClaimTTL)
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
	Lease  string    `json:"lease"`
}

// ClaimPeriod claims the period that starts at period (only recorded and
// reported: exclusion is per name). It returns the claim, or an error
// wrapping holdfast.ErrClaimed at once if the name's claim is taken, in one
// transaction after the lease grant. ctx bounds both requests. On a
// transport error the lease is revoked in the background (the session
// retries while it lives), which removes whatever the attempt created.
func (o *Once) ClaimPeriod(ctx context.Context, period time.Time) (*Claim, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if err := o.s.alive(); err != nil {
		return nil, fmt.Errorf("holdfast/etcd: claim %s: %w", o.name, err)
	}
	ctx, stop := bindContext(ctx, o.s.keeper.Context())
	defer stop()
	cli := o.s.client
	ttl := (o.sched.AtMost + time.Second - 1) / time.Second * time.Second
	sent := time.Now()
	lresp, err := cli.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return nil, o.fail(ctx, "grant the claim's lease", err)
	}
	lease := lresp.ID
	val, _ := json.Marshal(claimRecord{Period: period.UTC(), Lease: fmt.Sprintf("%x", int64(lease))})
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(o.key), "=", 0)).
		Then(clientv3.OpPut(o.key, string(val), clientv3.WithLease(lease))).
		Else(clientv3.OpGet(o.key)).
		Commit()
	got := time.Now()
	if err != nil {
		o.revoke(lease)
		return nil, o.fail(ctx, "create the claim key", err)
	}
	if !resp.Succeeded {
		o.revoke(lease)
		return nil, o.refused(period, first(resp.Responses[0]))
	}
	c := &Claim{o: o, lease: lease, rev: resp.Header.Revision, period: period.UTC(), value: string(val), made: got}
	keeper := core.NewKeeper(sent, grantedTTL(ttl, lresp.TTL), ttl/5)
	endWithSession := context.AfterFunc(o.s.keeper.Context(), func() { keeper.End(context.Cause(o.s.keeper.Context())) })
	c.base = core.NewGrant(keeper, o.s.bg, o.key, holdfast.Token(c.rev), c.release, func() {
		endWithSession()
		keeper.End(holdfast.ErrReleased) // stops its timer; the grant ended already
	})
	return c, nil
}

// refused is the error of a claim refused because kv holds the name's claim.
func (o *Once) refused(period time.Time, kv *mvccpb.KeyValue) error {
	var rec claimRecord
	if kv == nil || json.Unmarshal(kv.GetValue(), &rec) != nil {
		return fmt.Errorf("%w: %s for period %s", holdfast.ErrClaimed, o.name, period.UTC().Format(time.RFC3339))
	}
	if rec.Period.Equal(period) {
		return fmt.Errorf("%w: %s for period %s (token %d)", holdfast.ErrClaimed, o.name, period.UTC().Format(time.RFC3339), kv.GetCreateRevision())
	}
	return fmt.Errorf("%w: %s for period %s: the claim of period %s (token %d) still holds", holdfast.ErrClaimed, o.name, period.UTC().Format(time.RFC3339), rec.Period.Format(time.RFC3339), kv.GetCreateRevision())
}

// fail is the error of a failed claim: the session's end, ctx's error, or
// the store's.
func (o *Once) fail(ctx context.Context, what string, err error) error {
	if serr := o.s.alive(); serr != nil {
		return fmt.Errorf("holdfast/etcd: claim %s: %w", o.name, serr)
	}
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("holdfast/etcd: claim %s: %s: %w (%v)", o.name, what, ctx.Err(), err)
	}
	return fmt.Errorf("holdfast/etcd: claim %s: %s: %w", o.name, what, storeErr(err))
}

// revoke revokes lease in the session's background, retrying while the
// session lives (the lease expires by itself anyway).
func (o *Once) revoke(lease clientv3.LeaseID) {
	o.s.bg.Go(func(ctx context.Context) {
		_ = core.Retry(ctx, func(ctx context.Context) error {
			_, err := o.s.client.Revoke(ctx, lease)
			if err != nil && errors.Is(storeErr(err), holdfast.ErrSessionLost) {
				return nil // already gone
			}
			return storeErr(err)
		})
	})
}

// Claim is a held once-per-period claim. It implements holdfast.Grant: its
// key is "<name>/.claim", its token the key's create revision (tokens of
// successive claims of a name increase). Its context ends with ErrReleased
// on Unlock, and with an error wrapping holdfast.ErrLost at its safe
// deadline (see Deadline) or when the session ends.
type Claim struct {
	base   *core.Grant
	o      *Once
	lease  clientv3.LeaseID
	rev    int64
	period time.Time
	value  string
	made   time.Time          // when the answer of the creating request arrived
	kept   []clientv3.LeaseID // the leases release attempts granted to keep the key (release runs one attempt at a time)
}

var _ holdfast.Grant = (*Claim)(nil)

// Key implements holdfast.Grant: "<name>/.claim".
func (c *Claim) Key() string { return c.base.Key() }

// Token implements holdfast.Grant: the create revision of Key.
func (c *Claim) Token() holdfast.Token { return c.base.Token() }

// Period returns the start of the period claimed.
func (c *Claim) Period() time.Time { return c.period }

// Context implements holdfast.Grant.
func (c *Claim) Context() context.Context { return c.base.Context() }

// Deadline implements holdfast.Grant: the moment the claim request was sent
// plus AtMost (as granted, whole seconds) minus a fifth of it. The claim is
// never renewed: a run must finish by then.
func (c *Claim) Deadline() time.Time { return c.base.Deadline() }

// Unlock implements holdfast.Grant: the run is over. The claim stays taken
// in etcd until AtLeast after it was made, or is deleted by a guarded
// delete if AtLeast has passed. To stay, its key is moved, by a guarded put
// that keeps the token, to a lease of the remaining time (rounded up to
// whole seconds, and at least etcd's 2 s minimum), which the session
// revokes when AtLeast has passed; if the session ends first, the lease
// expires by itself. Either way the claim's own lease is then revoked.
func (c *Claim) Unlock(ctx context.Context) error { return c.base.Unlock(ctx) }

// Guard returns the comparison that holds exactly while this claim is held
// in etcd: its key carries the claim's own lease (which no other claim
// uses, and which Unlock detaches). Txn puts it in the If for you.
func (c *Claim) Guard() clientv3.Cmp {
	return clientv3.Compare(clientv3.LeaseValue(c.o.key), "=", c.lease)
}

// Txn runs ops in one etcd transaction that commits only while the claim is
// held (its If is Guard). If the claim ended (locally or in etcd), it
// applies nothing and returns an error wrapping holdfast.ErrNotHeld. ops
// may not touch the claim's key: such ops are refused with an error
// wrapping holdfast.ErrInvalidArgument before any request.
func (c *Claim) Txn(ctx context.Context, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	g := Grant{pfx: c.o.key}
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

// release ends the claim in etcd (one attempt; the core retries it): keep
// the key until AtLeast after the claim was made, or delete it, guarded by
// the claim's lease; then revoke that lease.
func (c *Claim) release(ctx context.Context) error {
	cli := c.o.s.client
	remaining := c.o.sched.AtLeast - time.Since(c.made)
	then := clientv3.OpDelete(c.o.key)
	var keep clientv3.LeaseID
	if remaining > 0 {
		secs := int64((remaining + time.Second - 1) / time.Second)
		lresp, err := cli.Grant(ctx, secs)
		if err != nil {
			return storeErr(err)
		}
		keep = lresp.ID
		c.kept = append(c.kept, keep)
		then = clientv3.OpPut(c.o.key, c.value, clientv3.WithLease(keep))
	}
	resp, err := cli.Txn(ctx).If(c.Guard()).Then(then).Else(clientv3.OpGet(c.o.key)).Commit()
	if err != nil {
		if keep != 0 {
			c.o.revoke(keep)
		}
		return storeErr(err)
	}
	if !resp.Succeeded {
		if keep != 0 {
			c.o.revoke(keep)
		}
		kv := first(resp.Responses[0])
		if kv == nil || kv.CreateRevision != c.rev || !slices.Contains(c.kept, clientv3.LeaseID(kv.Lease)) {
			return fmt.Errorf("%w: %s no longer carries the claim's lease %x", holdfast.ErrNotHeld, c.Key(), int64(c.lease))
		}
		// Our key, moved to a lease of an earlier attempt: that attempt
		// applied, and its lease keeps the key.
		keep = clientv3.LeaseID(kv.Lease)
	}
	_, err = cli.Revoke(ctx, c.lease)
	if err != nil && !errors.Is(storeErr(err), holdfast.ErrSessionLost) {
		c.o.revoke(c.lease)
	}
	if keep != 0 {
		// End the claim when AtLeast has passed, while the session lives;
		// if it ends first, the lease does it, rounded up.
		c.o.s.bg.Go(func(ctx context.Context) {
			t := time.NewTimer(time.Until(c.made.Add(c.o.sched.AtLeast)))
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
				c.o.revoke(keep)
			}
		})
	}
	return nil
}
