package consul

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// How a permit ends: steps 2, 5 and 6 of DESIGN.md's Consul semaphore.

// maxLeaveAttempts bounds a leave's (and Mutex.repairTail's) lost races.
const maxLeaveAttempts = 8

// raceBackoff paces the writes of the lock key that lost a race (errStale)
// from 2 ms, not core.Backoff's 50 ms: a fresh read answers at once.
var raceBackoff = core.Backoff{
	First: 2 * time.Millisecond, Max: 64 * time.Millisecond, Jitter: true, Tries: maxLeaveAttempts,
	Final: func(err error) bool { return !errors.Is(err, errStale) },
}

// leaveMode says what leave does.
type leaveMode int

const (
	leaveRelease   leaveMode = iota // Unlock, or the end of a lost grant
	leaveCleanup                    // after a failed acquisition
	leaveDowngrade                  // RWMutex.Downgrade
)

// release leaves the holders, handing the permit on (see releaser).
func (a *pacq) release(ctx context.Context, g *Grant) error {
	err := a.p.leave(ctx, leaveRelease)
	if errors.Is(err, holdfast.ErrNotHeld) && errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) {
		a.p.s.checkSoon() // an Unlock found the key taken: look at the others
	}
	return err
}

// drop leaves the holders as the session closes, handing the permit on.
func (a *pacq) drop(ctx context.Context, _ *Grant) error { return a.p.leave(ctx, leaveRelease) }

// leave removes us from the holders and the queue, admitting the waiters
// that then fit (Downgrade: makes us a reader). An error wraps
// holdfast.ErrNotHeld if our session no longer holds our key.
func (p *permits) leave(ctx context.Context, how leaveMode) error {
	return raceBackoff.Retry(ctx, func(ctx context.Context) error { return p.leaveOnce(ctx, how) })
}

// leaveOnce is one attempt: a read, then one guarded transaction.
func (p *permits) leaveOnce(ctx context.Context, how leaveMode) error {
	v, err := p.read(ctx, how == leaveCleanup)
	if err != nil {
		return err
	}
	hookLeaveRead(p)
	notHeld := fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, p.myKey, p.s.id)
	if how == leaveCleanup {
		notHeld = nil // nothing of ours left to remove
	}
	_, in := v.st.holders[p.s.id]
	switch {
	case v.me == nil:
		return notHeld
	case how == leaveDowngrade && in && v.err != nil:
		return v.err
	case how == leaveDowngrade && !in:
		return fmt.Errorf("%w: %s is no longer counted among the holders of %s", holdfast.ErrNotHeld, p.s.id, p.lockKey)
	}
	guard := permitReleaseGuard(p.myKey, p.s.id)
	ops, after := p.leaveOps(v, how, in)
	_, err = p.write(ctx, append(guard, ops...), after)
	var rb *rollback
	switch {
	case err == nil && how == leaveRelease && !in:
		// A live holder is never pruned: the lock key was rewritten.
		return fmt.Errorf("%w: %s was no longer among the holders in %s", holdfast.ErrNotHeld, p.s.id, p.lockKey)
	case errors.As(err, &rb) && rb.denied():
		return txnError("release "+p.myKey, rb)
	case rb != nil && rb.failedBefore(len(guard)):
		return notHeld
	case rb != nil:
		return errStale // the lock key or a waiter changed: read again
	}
	return err
}

// leaveOps are a leave's writes from v (in: we are a holder); after: they
// leave room, or a waiter leaves (step 6).
func (p *permits) leaveOps(v pview, how leaveMode, in bool) (ops api.TxnOps, after bool) {
	mine := kvOp(api.KVDelete, p.myKey)
	switch {
	case !in: // a waiter's key, unless a release admitted it meanwhile
		mine = deleteCAS(p.myKey, v.me.ModifyIndex)
	case how == leaveDowngrade:
		mine = &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: p.myKey, Index: v.me.ModifyIndex, Flags: p.flags, Value: []byte(valDowngraded)}}
	}
	if v.err != nil { // the lock key is not ours to write: a holder becomes a dead one
		return api.TxnOps{mine}, false
	}
	st := v.st
	if in { // step 2
		st = st.clone()
		delete(st.holders, p.s.id)
		if how == leaveDowngrade {
			st.holders[p.s.id] = false
		}
	}
	// All waiters but ours: a late join of ours may have replaced our key.
	others := slices.DeleteFunc(slices.Clone(v.waiters), func(w contender) bool { return w.key == p.myKey })
	st, admitted := p.admit(st, others)
	switch {
	case !in && len(admitted) == 0: // step 5: a waiter's leave admits nobody
	case len(st.holders) == 0 && len(others) == 0 && v.lock != nil:
		ops = api.TxnOps{deleteCAS(p.lockKey, v.lock.ModifyIndex)} // nothing left behind
	default:
		ops = p.writeOps(v, st, admitted)
	}
	return append(ops, mine), !in || p.roomy(st)
}

// passOn admits the waiters that fit in v, the subtree as a write of ours
// left it with room (step 6). Best effort: else they re-read in blockWait.
func (p *permits) passOn(ctx context.Context, v pview) {
	reread := false
	_ = raceBackoff.Retry(ctx, func(ctx context.Context) (err error) {
		if reread {
			if v, err = p.read(ctx, false); err != nil {
				return err
			}
		}
		reread = true
		st, in := p.admit(v.st, v.waiters)
		if v.err != nil || len(in) == 0 {
			return nil
		}
		_, err = p.write(ctx, p.writeOps(v, st, in), p.roomy(st))
		var rb *rollback
		if errors.As(err, &rb) && !rb.denied() {
			return errStale
		}
		return err
	})
}
