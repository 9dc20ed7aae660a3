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

// How a permit is taken: TryLock's one shot and Lock's wait (steps 1, 3 and
// 4 of docs/DESIGN.md, "Consul semaphore and read-write lock"), run by the
// driver (acquire.go).

// acquire runs Lock (try false) or TryLock through p, reentrant if reentry
// is not nil.
func (p *permits) acquire(ctx context.Context, exclusive, try bool, reentry *core.Reentry[*Grant]) (*Grant, error) {
	return acquire(ctx, p.s, p.name, try, reentry, &pacq{p: p, exclusive: exclusive})
}

// pacq is one acquisition of a permit in progress (a joiner).
type pacq struct {
	p         *permits
	exclusive bool
	left      bool // something of ours may be in Consul
	// uncertain: a join or an admission was sent and its outcome is unknown
	// (see Session.sweepLater).
	uncertain bool
}

func (a *pacq) join(ctx context.Context, try bool) (uint64, error) {
	if try {
		return a.try(ctx)
	}
	return a.wait(ctx)
}

func (a *pacq) cleanup() (leftover, bool, bool) { return a.p.leftover(), a.left, a.uncertain }

func (a *pacq) grant(token uint64, free func()) (*Grant, error) {
	return a.p.grant(token, a.exclusive, free)
}

// grant wraps an admitted contender key in a Grant.
func (p *permits) grant(token uint64, exclusive bool, free func()) (*Grant, error) {
	g := &Grant{s: p.s, prefix: p.prefix, rel: &permitHold{p: p, exclusive: exclusive, free: free}}
	g.base = core.NewGrant(p.s.keeper, p.s.bg, p.myKey, holdfast.Token(token), (*ending)(g), free)
	p.s.hold(g)
	if g.Context().Err() != nil {
		return nil, p.s.alive() // the session ended meanwhile; Close releases the key
	}
	return g, nil
}

// leftover is the cleanup of what a failed acquisition or Downgrade may
// have left: our key, and our place among the holders.
func (p *permits) leftover() leftover {
	return leftover{name: p.name, fn: func(ctx context.Context) error {
		_, err := p.leave(ctx, leaveCleanup)
		if errors.Is(err, holdfast.ErrNotHeld) {
			return nil // our session no longer holds the key: nothing to remove
		}
		return err
	}}
}

// try is TryLock: one read; if the permit is free and nobody waits, one
// transaction that creates our key already admitted and adds us to the lock
// key by CAS. It writes nothing otherwise.
func (a *pacq) try(ctx context.Context) (uint64, error) {
	p := a.p
	v, err := p.read(ctx)
	if err == nil {
		hookTryRead(p)
	}
	switch {
	case err != nil:
		return 0, err
	case v.err != nil:
		return 0, v.err
	case len(v.waiters) > 0 || !p.fits(v.st, a.exclusive):
		return 0, fmt.Errorf("%w: %s has no free permit, or contenders wait for one", holdfast.ErrLocked, p.name)
	}
	st := v.st.clone()
	delete(st.holders, p.s.id)
	st.holders[p.s.id] = a.exclusive
	ops := p.writeOps(v, st, nil)
	ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVLock, Key: p.myKey, Session: p.s.id, Flags: p.kind().flags, Value: []byte(valHeld)}})
	return a.admitTxn(ctx, ops, len(ops)-1, true, p.roomy(st))
}

// admitTxn sends ops, which write st to the lock key (their first operation,
// admitting in) and put our key in its held state (operation mine), and
// returns the token. A race (the lock key or a waiter changed) is token 0
// with no error, or ErrLocked if try. If room (st leaves a permit free), the
// transaction reads the subtree after its writes, and the permits are
// passed on to the waiters that joined meanwhile (step 6, passOn).
func (a *pacq) admitTxn(ctx context.Context, ops api.TxnOps, mine int, try, room bool) (uint64, error) {
	p := a.p
	if room {
		ops = append(ops, p.readAfter())
	}
	resp, err := a.send(ctx, "acquire a permit of", ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb) && try:
		a.left = false
		return 0, fmt.Errorf("%w: %s changed meanwhile", holdfast.ErrLocked, p.name)
	case rb != nil:
		return 0, nil
	case err != nil:
		return 0, err
	case len(resp.Results) < len(ops):
		return 0, errors.New("holdfast/consul: acquire: Consul's answer lacks results")
	}
	ours := resp.Results[mine].KV
	if ours == nil || ours.Key != p.myKey {
		return 0, errors.New("holdfast/consul: acquire: Consul's answer has no entry for our key")
	}
	if room {
		p.passOn(ctx, p.parse(resp.Results))
	}
	return ours.ModifyIndex, nil
}

// send sends a transaction that writes our key (what: for errors). An ACL
// refusal and the end of our session are errors; another rollback is
// returned as it is (the keys changed); an error without an answer leaves
// the outcome unknown.
func (a *pacq) send(ctx context.Context, what string, ops api.TxnOps) (*api.TxnResponse, error) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	a.left = true
	resp, err := a.p.s.txn(rctx, ops)
	var rb *rollback
	switch {
	case err == nil:
	case errors.As(err, &rb) && rb.denied():
		return nil, txnError(what+" "+a.p.name, rb)
	case rb != nil && (rb.sessionGone() || rb.lockDelayed()):
		return nil, a.p.s.ended()
	case rb == nil:
		a.uncertain = true
	}
	return resp, err
}

// enter creates our contender key (replacing a leftover of ours, so that
// our place is at the back) and reads the subtree, in one transaction.
func (a *pacq) enter(ctx context.Context) (pview, error) {
	p := a.p
	resp, err := a.send(ctx, "join", api.TxnOps{
		kvOp(api.KVDelete, p.myKey),
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: p.myKey, Session: p.s.id, Flags: p.kind().flags, Value: p.waitValue(a.exclusive)}},
		kvOp(api.KVGetTree, p.prefix),
	})
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return pview{}, txnError("join "+p.name, rb)
	case err != nil:
		return pview{}, err
	}
	return p.parse(resp.Results), nil
}

// wait is Lock's algorithm (docs/DESIGN.md, "Consul semaphore and
// read-write lock"): join, then wait in the queue until admitted.
func (a *pacq) wait(ctx context.Context) (uint64, error) {
	p := a.p
	v, err := a.enter(ctx) // 1. create our key, read the subtree
	if err != nil {
		return 0, err
	}
	for joins := 1; ; {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if v.err != nil {
			return 0, v.err
		}
		if len(v.dead) > 0 {
			p.s.dropDead(ctx, v.dead)
			v.dead = nil
		}
		if v.admitted(p) {
			return v.me.ModifyIndex, nil
		}
		if !v.waiting(p) {
			// Our key vanished, lost its session, or was marked held
			// without our session being a holder: join again.
			if joins++; joins > 3 { // in a row
				return 0, fmt.Errorf("holdfast/consul: %s: our contender key keeps vanishing", p.name)
			}
			if v, err = a.enter(ctx); err != nil {
				return 0, err
			}
			continue
		}
		joins = 0
		if token, got, err := a.waitOnce(ctx, v); err != nil || got {
			return token, err
		}
		if v, err = p.read(ctx); err != nil { // 3. a re-read prunes dead holders
			return 0, err
		}
	}
}

// handoffPatience is how long the head of the queue first waits on its own
// key, which a holdfast release that admits it marks, before it also
// watches for a holder's key gone with its session (the whole subtree,
// woken by every join too): a dead holder's permit is free within it.
const handoffPatience = 250 * time.Millisecond

// waitOnce is one wait of our key, queued in v. It reports whether we got
// in; if not, the caller reads again.
func (a *pacq) waitOnce(ctx context.Context, v pview) (uint64, bool, error) {
	ahead := v.ahead()
	if len(ahead) > 0 { // 3. holdfast waiters are ahead of us
		return a.behind(ctx, v, ahead[len(ahead)-1])
	}
	token, got, full, err := a.tryHead(ctx, v) // 4. the head admits itself
	if err != nil || got || !full {
		return token, got, err
	}
	// Patient only if .lock moved since we joined (releases are handing
	// permits on); else its holders may be dead: watch the subtree at once.
	return a.atHead(ctx, v, v.lock != nil && v.lock.ModifyIndex > v.me.CreateIndex && !v.foreign)
}

// behind is the wait of a waiter behind others: the write that admits us
// admits the waiter just ahead of us, pred, too (admissions go in queue
// order), so we wait for pred's key to change (at most blockWait): admitted
// with us (marked held+next by that write, whose index is our token too),
// admitted alone (we are the head now), gone, or dead. It reports whether
// we got in; if not, the caller reads again.
func (a *pacq) behind(ctx context.Context, v pview, pred contender) (uint64, bool, error) {
	next, err := a.p.s.watchKey(ctx, pred.key, pred.index, blockWait)
	switch {
	case err != nil || next == nil || next.Session != pred.session || next.ModifyIndex <= pred.index:
		return 0, false, err
	case string(next.Value) == valHeldNext:
		return next.ModifyIndex, true, nil
	case string(next.Value) == valHeld:
		return a.atHead(ctx, v, !v.foreign) // v is older than that write: atHead reads first
	}
	return 0, false, nil
}

// atHead is the wait of the head of the queue, whose view v has no room for
// it. If patient (no foreign contender, whose release hands nothing over, is
// about: every release that frees a permit hands it to us), it first waits
// on its own key for handoffPatience. Then it waits for the subtree to
// change, as api.Semaphore's waiter does (a release admitting us, a
// holder's key gone or freed with its session, a foreign contender's
// write), and admits us (with the waiters behind us that fit) once there is
// room. It reports whether we got in; if not (no change within blockWait,
// or a change the caller sees to), the caller reads again.
func (a *pacq) atHead(ctx context.Context, v pview, patient bool) (uint64, bool, error) {
	p := a.p
	if patient {
		pair, err := p.s.watchKey(ctx, p.myKey, v.me.ModifyIndex, handoffPatience)
		switch {
		case err != nil:
			return 0, false, err
		case pair == nil:
		case pair.Session == p.s.id && (string(pair.Value) == valHeld || string(pair.Value) == valHeldNext):
			return pair.ModifyIndex, true, nil
		default:
			return 0, false, nil // our key changed otherwise
		}
	}
	for {
		pairs, index, err := p.s.watchTree(ctx, p.prefix, v.index, blockWait)
		if err != nil || pairs == nil {
			return 0, false, err
		}
		v = p.parseKVs(pairs)
		v.index = index
		if len(v.dead) > 0 {
			p.s.dropDead(ctx, v.dead)
		}
		switch {
		case v.admitted(p):
			return v.me.ModifyIndex, true, nil
		case v.err != nil || !v.waiting(p) || len(v.ahead()) > 0:
			return 0, false, nil
		}
		token, got, full, err := a.tryHead(ctx, v)
		if err != nil || got || !full {
			return token, got, err
		}
	}
}

// tryHead admits us, at the head of the queue, if the lock key v.lock has
// room, with the waiters behind us that fit too. full reports that there
// is no room for us.
func (a *pacq) tryHead(ctx context.Context, v pview) (token uint64, got, full bool, err error) {
	p := a.p
	queue := []contender{{key: p.myKey, session: p.s.id, index: v.me.ModifyIndex, create: v.me.CreateIndex, exclusive: a.exclusive}}
	for _, w := range v.waiters {
		if w.create > v.me.CreateIndex {
			queue = append(queue, w)
		}
	}
	st, in := p.admit(v.st, queue)
	if len(in) == 0 {
		return 0, false, true, nil
	}
	token, err = a.admitTxn(ctx, p.writeOps(v, st, in), 1, false, p.roomy(st))
	return token, token != 0, false, err
}
