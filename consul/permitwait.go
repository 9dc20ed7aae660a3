package consul

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// How a permit is taken: steps 1, 3 and 4 of DESIGN.md's Consul semaphore.

// acquire runs Lock or (try) TryLock, reentrant if reentry is set.
func (p *permits) acquire(ctx context.Context, exclusive, try bool, reentry *core.Reentry[*Grant]) (*Grant, error) {
	return acquire(ctx, p.s, p.name, try, reentry, &pacq{p: p, exclusive: exclusive})
}

// pacq is one acquisition of a permit (a joiner), then its grant's
// releaser (permitleave.go).
type pacq struct {
	p         *permits
	exclusive bool
	left      bool   // a write of ours may have applied
	uncertain bool   // a write got no answer (see Session.sweepLater)
	free      func() // frees the name in-process once the grant ended
}

func (a *pacq) cleanup() (leftover, bool, bool) { return a.p.leftover(), a.left, a.uncertain }

// grant wraps our admitted contender key in a Grant that a releases.
func (a *pacq) grant(token uint64, free func()) (*Grant, error) {
	a.free = free
	return a.p.s.grant(a.p.myKey, a.p.prefix, token, a, free)
}

// leftover removes our key and our place among the holders.
func (p *permits) leftover() leftover {
	return leftover{name: p.name, clean: func(ctx context.Context) error { return p.leave(ctx, leaveCleanup) }}
}

// try is TryLock: a read, then, if a permit is free and nobody waits, one
// transaction that adds us to the lock key and creates our key admitted.
func (a *pacq) try(ctx context.Context) (uint64, error) {
	p := a.p
	v, err := p.read(ctx, false)
	if err = cmp.Or(err, v.err); err != nil {
		return 0, err
	}
	hookTryRead(p)
	if len(v.waiters) > 0 || !p.fits(v.st, a.exclusive) {
		return 0, fmt.Errorf("%w: %s has no free permit, or contenders wait for one", holdfast.ErrLocked, p.name)
	}
	st, _ := p.admit(v.st, []contender{{session: p.s.id, exclusive: a.exclusive}})
	ops := append(p.writeOps(v, st, nil), &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: p.myKey, Session: p.s.id, Flags: p.flags, Value: []byte(valHeld)}})
	return a.admitTxn(ctx, ops, true, p.roomy(st))
}

// admitTxn sends ops, which write the lock key, then our key held, and
// returns our token; a lost race is 0 (ErrLocked if try).
func (a *pacq) admitTxn(ctx context.Context, ops api.TxnOps, try, after bool) (uint64, error) {
	resp, err := a.send(ctx, "acquire a permit of", ops, after)
	var rb *rollback
	switch {
	case errors.As(err, &rb) && try:
		return 0, fmt.Errorf("%w: %s changed meanwhile", holdfast.ErrLocked, a.p.name)
	case rb != nil:
		return 0, nil
	case err == nil && (len(resp.Results) < 2 || resp.Results[1].KV == nil):
		return 0, errors.New("holdfast/consul: acquire: Consul's answer has no entry for our key")
	case err != nil:
		return 0, err
	}
	return resp.Results[1].KV.ModifyIndex, nil
}

// send sends a transaction that writes our key: a race is an error wrapping
// the *rollback; an ACL refusal (txnError) or our session's end is not.
func (a *pacq) send(ctx context.Context, what string, ops api.TxnOps, after bool) (*api.TxnResponse, error) {
	resp, err := a.p.write(ctx, ops, after)
	var rb *rollback
	switch {
	case errors.As(err, &rb) && (rb.sessionGone() || rb.lockDelayed()):
		return nil, a.p.s.ended()
	case rb != nil:
		return nil, txnError(what+" "+a.p.name, rb)
	case err != nil:
		a.uncertain = true
	}
	a.left = true // not rolled back
	return resp, err
}

// enter creates our contender key at the back of the queue (replacing a
// leftover of ours) and reads the subtree, in one transaction.
func (a *pacq) enter(ctx context.Context) (pview, error) {
	p := a.p
	val := p.shared
	if a.exclusive {
		val = p.writer
	}
	resp, err := a.send(ctx, "join", api.TxnOps{
		kvOp(api.KVDelete, p.myKey),
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: p.myKey, Session: p.s.id, Flags: p.flags, Value: []byte(val)}},
		kvOp(api.KVGetTree, p.prefix),
	}, false)
	if err != nil {
		return pview{}, err
	}
	return p.parse(latest(resp.Results)), nil
}

// join is Lock (TryLock if try: see pacq.try): join, then wait in the
// queue until admitted.
func (a *pacq) join(ctx context.Context, try bool) (uint64, error) {
	if try {
		return a.try(ctx)
	}
	p := a.p
	v, err := a.enter(ctx) // 1. create our key, read the subtree
	for joins := 1; ; {
		if err = cmp.Or(err, ctx.Err(), v.err); err != nil {
			return 0, err
		}
		p.s.dropDead(ctx, v.dead)
		if v.admitted(p) {
			return v.me.ModifyIndex, nil
		}
		if v.pos < 0 { // our key vanished, or is marked held while we are no holder
			if joins++; joins > 3 { // in a row
				return 0, fmt.Errorf("holdfast/consul: %s: our contender key keeps vanishing", p.name)
			}
			v, err = a.enter(ctx)
			continue
		}
		joins = 0
		var token uint64
		var full bool
		if v.pos > 0 { // 3. behind others
			token, err = a.behind(ctx, v, v.waiters[v.pos-1])
		} else if token, full, err = a.tryHead(ctx, v); full { // 4. the head admits itself
			// Patient only if .lock moved since we joined (releases hand permits on).
			token, err = a.atHead(ctx, v, v.lock != nil && v.lock.ModifyIndex > v.me.CreateIndex && !v.foreign)
		}
		if err != nil || token != 0 {
			return token, err
		}
		v, err = p.read(ctx, false) // a re-read prunes dead holders
	}
}

// handoffPatience is how long the head waits on its own key, which a
// release that admits it marks, before it watches the subtree too.
const handoffPatience = 250 * time.Millisecond

// behind is step 3: it waits (at most blockWait) for pred's key, the waiter
// just ahead of us, to change. 0: the caller reads again.
func (a *pacq) behind(ctx context.Context, v pview, pred contender) (uint64, error) {
	next, err := a.p.s.watchKey(ctx, pred.key, pred.index, blockWait)
	switch {
	case err != nil || next == nil || next.Session != pred.session || next.ModifyIndex <= pred.index:
		return 0, err
	case string(next.Value) == valHeldNext:
		return next.ModifyIndex, nil
	case string(next.Value) == valHeld:
		return a.atHead(ctx, v, !v.foreign) // v is older than that write: the tree watch answers at once
	}
	return 0, nil
}

// atHead is step 4's wait of the head, whose view v has no room (if
// patient, first on its own key). 0: the caller reads again.
func (a *pacq) atHead(ctx context.Context, v pview, patient bool) (uint64, error) {
	p := a.p
	if patient {
		pair, err := p.s.watchKey(ctx, p.myKey, v.me.ModifyIndex, handoffPatience)
		if err == nil && pair != nil && pair.Session == p.s.id && held(string(pair.Value)) {
			return pair.ModifyIndex, nil
		} else if err != nil || pair != nil {
			return 0, err // our key changed otherwise: the caller reads again
		}
	}
	for {
		pairs, index, err := p.s.watchTree(ctx, p.prefix, v.index, blockWait)
		if err != nil || pairs == nil {
			return 0, err
		}
		v = p.parse(pairs)
		v.index = index
		p.s.dropDead(ctx, v.dead)
		switch {
		case v.admitted(p):
			return v.me.ModifyIndex, nil
		case v.err != nil || v.pos != 0:
			return 0, nil
		}
		if token, full, err := a.tryHead(ctx, v); !full {
			return token, err
		}
	}
}

// tryHead admits us, the head of v's queue, and the waiters behind us that
// fit; full: v has no room for us.
func (a *pacq) tryHead(ctx context.Context, v pview) (token uint64, full bool, err error) {
	p := a.p
	st, in := p.admit(v.st, v.waiters)
	if len(in) == 0 {
		return 0, true, nil
	}
	token, err = a.admitTxn(ctx, p.writeOps(v, st, in), false, p.roomy(st))
	return token, false, err
}
