package consul

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// How a permit ends: a release, a cleanup, a Downgrade, and the handoffs
// they make (steps 2, 5 and 6 of docs/DESIGN.md, "Consul semaphore and
// read-write lock").

// maxLeaveAttempts bounds the attempts of one release or cleanup before it
// reports errStale (and core.Retry tries again after a pause).
const maxLeaveAttempts = 8

// raceBackoff paces the attempts of a write of the lock key that lost a
// race for it (errStale): random pauses from up to 2 ms, doubling to 64 ms,
// so that holders releasing at once do not collide again, at most
// maxLeaveAttempts attempts. Not core.Backoff's 50 ms: a lost race is
// answered by a fresh read within milliseconds, and 50 ms would stall
// every contended release. Any other error ends the attempts: the caller
// retries a store error (core.Retry in cleanup, Unlock).
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

// permitHold is what a permit's release and Downgrade need.
type permitHold struct {
	p         *permits
	exclusive bool
	free      func() // frees the name in-process; passed to the read grant on Downgrade
}

// release is a permit's release (see releaser): a leave, which hands the
// permit on, or does nothing if our session no longer holds the key.
func (h *permitHold) release(ctx context.Context, g *Grant) error {
	_, err := h.p.leave(ctx, leaveRelease)
	if errors.Is(err, holdfast.ErrNotHeld) && errors.Is(context.Cause(g.Context()), holdfast.ErrReleased) {
		h.p.s.checkSoon() // an Unlock found the key taken: look at the others
	}
	return err
}

// drop leaves the holders as the session closes, handing the permit on.
func (h *permitHold) drop(ctx context.Context, _ *Grant) error {
	_, err := h.p.leave(ctx, leaveRelease)
	return err
}

// leave is a release or a cleanup: it removes us from the holders (handing
// the permit to the waiters that then fit, in queue order) and deletes our
// contender key, in one transaction guarded by our session holding the key
// and CAS on the lock key; a Downgrade turns our exclusive permit into a
// shared one instead, and returns the new token. A key of ours that is not
// (or no longer) a holder's is deleted by CAS, so that a handoff to us
// meanwhile is seen and passed on. It returns an error wrapping
// holdfast.ErrNotHeld if our session no longer holds the key (nothing then
// to do: if we were a holder, we are dead and will be pruned), and errStale
// after repeated races.
func (p *permits) leave(ctx context.Context, how leaveMode) (uint64, error) {
	var token uint64
	err := raceBackoff.Retry(ctx, func(ctx context.Context) (err error) {
		token, err = p.leaveOnce(ctx, how)
		return err
	})
	return token, err
}

// leaveOnce is one attempt of leave: a read, then one transaction; errStale
// if that lost a race.
func (p *permits) leaveOnce(ctx context.Context, how leaveMode) (uint64, error) {
	read := p.read
	if how == leaveCleanup {
		read = p.readOrdered
	}
	v, err := read(ctx)
	if err != nil {
		return 0, err
	}
	hookLeaveRead(p)
	if v.me == nil {
		if how == leaveCleanup {
			return 0, nil // nothing of ours left
		}
		return 0, fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, p.myKey, p.s.id)
	}
	_, in := v.st.holders[p.s.id]
	guard := permitReleaseGuard(p.myKey, p.s.id)
	var ops api.TxnOps
	var after bool // read the subtree after the writes, and passOn
	switch {
	case v.err != nil && in && how == leaveDowngrade:
		return 0, v.err
	case v.err != nil && in:
		// The lock key is not ours to write any more (a foreign value
		// replaced it): never overwrite it; deleting our key makes us a
		// dead holder, pruned by whoever can read the value.
		ops = api.TxnOps{kvOp(api.KVDelete, p.myKey)}
	case in:
		ops, after = p.holderLeaves(v, how)
	case how == leaveDowngrade:
		return 0, fmt.Errorf("%w: %s is no longer counted among the holders of %s", holdfast.ErrNotHeld, p.s.id, p.lockKey)
	default:
		ops, after = p.waiterLeaves(v)
	}
	return p.sendLeave(ctx, how, in, append(guard, ops...), len(guard), after)
}

// holderLeaves are the writes of a holder's leave from v (step 2): the
// lock key without us (or with us shared, on Downgrade), with the waiters
// that then fit admitted, or deleted if nobody is left; our key deleted
// (marked downgraded). after: the result leaves room (see passOn).
func (p *permits) holderLeaves(v pview, how leaveMode) (ops api.TxnOps, after bool) {
	st := v.st.clone()
	if how == leaveDowngrade {
		st.holders[p.s.id] = false
	} else {
		delete(st.holders, p.s.id)
	}
	others := v.others(p) // our own key waits if a late join of ours replaced it
	st, admitted := p.admit(st, others)
	if len(st.holders) == 0 && len(others) == 0 && v.lock != nil {
		ops = append(ops, deleteCAS(p.lockKey, v.lock.ModifyIndex)) // nothing left behind
	} else {
		ops = append(ops, p.writeOps(v, st, admitted)...)
	}
	if how == leaveDowngrade {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: p.myKey, Index: v.me.ModifyIndex, Flags: p.kind().flags, Value: []byte(valDowngraded)}})
	} else {
		ops = append(ops, kvOp(api.KVDelete, p.myKey))
	}
	return ops, p.roomy(st)
}

// waiterLeaves are the writes of a waiter's leave from v (step 5): our key
// deleted by CAS, and the waiters that now fit admitted (we may have been
// the head, with room). after: a waiter behind us that joined after our
// read may trust us to admit it. The waiter behind us watches our key, so
// it learns of our leaving; a release that was to admit us fails its CAS
// on our key and reads again.
func (p *permits) waiterLeaves(v pview) (ops api.TxnOps, after bool) {
	ops = api.TxnOps{deleteCAS(p.myKey, v.me.ModifyIndex)}
	if v.err != nil {
		return ops, false
	}
	if st, admitted := p.admit(v.st, v.others(p)); len(admitted) > 0 {
		ops = append(ops, p.writeOps(v, st, admitted)...)
	}
	return ops, true
}

// sendLeave sends a leave's ops, whose first held operations are the guard
// that our session holds our key (in: we were a holder), reading the
// subtree after them and passing the permits on if after.
func (p *permits) sendLeave(ctx context.Context, how leaveMode, in bool, ops api.TxnOps, held int, after bool) (uint64, error) {
	n := len(ops)
	if after {
		ops = append(ops, p.readAfter())
	}
	resp, err := p.s.txn(ctx, ops)
	if err == nil && after && len(resp.Results) >= n {
		p.passOn(ctx, p.parse(resp.Results))
	}
	var rb *rollback
	switch {
	case err == nil && how == leaveDowngrade:
		return resp.Results[n-1].KV.ModifyIndex, nil
	case err == nil && how == leaveRelease && !in:
		// A holder's entry is pruned only once its key is gone: the
		// lock key was rewritten or deleted from outside.
		return 0, fmt.Errorf("%w: %s was no longer among the holders in %s", holdfast.ErrNotHeld, p.s.id, p.lockKey)
	case err == nil:
		return 0, nil
	case errors.As(err, &rb) && rb.denied():
		return 0, txnError("release "+p.myKey, rb)
	case rb != nil && rb.failedBefore(held):
		return 0, fmt.Errorf("%w: %s is no longer held by session %s", holdfast.ErrNotHeld, p.myKey, p.s.id)
	case rb != nil:
		return 0, errStale // the lock key or a waiter changed: read again
	}
	return 0, err
}

// passOn admits, after a write of ours left permits free, the waiters that
// now fit: those that joined after the view the write was computed from
// and before it landed (step 6). Such a waiter found a holdfast waiter
// ahead of it and trusts the write that admits that one to admit it too, or
// to leave it at the head of a full semaphore (then the next release, whose
// read comes after our write, hands it a permit). v is the subtree as our
// write left it. A waiter that joined after our write saw it, and is at the
// head or behind someone whose admission it watches. Best effort: on an
// error the waiters re-read after blockWait.
func (p *permits) passOn(ctx context.Context, v pview) {
	reread := false
	_ = raceBackoff.Retry(ctx, func(ctx context.Context) error {
		if reread {
			var err error
			if v, err = p.read(ctx); err != nil {
				return err
			}
		}
		reread = true
		for range maxLeaveAttempts {
			next, err := p.admitNext(ctx, v)
			if err != nil || next == nil {
				return err
			}
			v = *next
		}
		return nil
	})
}

// admitNext admits the waiters of v that fit, in one write; it returns the
// subtree after it if it left room (more may fit now), nil if nothing is
// left to do, errStale if the lock key or a waiter changed.
func (p *permits) admitNext(ctx context.Context, v pview) (*pview, error) {
	if v.err != nil {
		return nil, nil
	}
	st, in := p.admit(v.st, v.waiters)
	if len(in) == 0 {
		return nil, nil
	}
	ops := p.writeOps(v, st, in)
	room := p.roomy(st)
	if room {
		ops = append(ops, p.readAfter())
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := p.s.txn(rctx, ops)
	var rb *rollback
	switch {
	case err == nil && room:
		next := p.parse(resp.Results)
		return &next, nil
	case err == nil:
		return nil, nil
	case errors.As(err, &rb) && !rb.denied():
		return nil, errStale
	}
	return nil, err
}
