package consul

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// leftover is what a failed acquisition of name may have left in Consul:
// m's queue entry, and its lock key if our session may hold it (an acquire
// whose outcome we did not learn, or a handoff to us while we gave up).
type leftover struct {
	name string
	m    *Mutex
	// fn, if set, is the cleanup itself (a Semaphore's or RWMutex's: see
	// permits.leave); m is then unused.
	fn func(context.Context) error
}

// cleanUp removes l as a background task of the session, retried (see
// core.Retry) until Consul answers or the session ends, and then calls free,
// which frees the name in this session: the name is not locked again
// through the session until the store has seen the cleanup, so a stale queue
// key or lock key of ours is never mistaken for a new one. The returned
// channel is closed when the task is over. If the session ends first, the
// task makes one last attempt (bounded by core.AttemptTimeout), and if that
// fails too, so does Close.
func (s *Session) cleanUp(l leftover, free func()) <-chan struct{} {
	done := make(chan struct{})
	task := func(ctx context.Context) {
		defer close(done)
		defer free()
		err := core.Retry(ctx, func(actx context.Context) error { return s.clean(actx, l) })
		if err == nil || ctx.Err() == nil {
			return // done, or refused for good
		}
		// The session ended (a waiter whose session was destroyed, say):
		// one last bounded attempt, since a queue key left by a session
		// with Behavior release stays in Consul.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), core.AttemptTimeout)
		defer cancel()
		if s.clean(actx, l) != nil {
			s.abandon(l)
		}
	}
	if !s.bg.Go(task) {
		s.abandon(l)
		free()
		close(done)
	}
	return done
}

// sweepLater runs l's cleanup again after each of sweepDelays, for a write
// of a failed acquisition that got no answer and may land after the first
// cleanup (a queue entry with no Lock behind it would keep the lock for our
// session). Each run takes the name's slot, and is retried until Consul
// answers, while the session lives (docs/DESIGN.md, "Consul acquire").
func (s *Session) sweepLater(l leftover) {
	s.abandon(l) // and Close sweeps once more, for a request that lands later still
	s.bg.Go(func(ctx context.Context) {
		for _, d := range sweepDelays {
			if !sleep(ctx, d) {
				return
			}
			free, err := s.names.Acquire(ctx, l.name)
			if err != nil {
				return
			}
			err = core.Retry(ctx, func(actx context.Context) error { return s.clean(actx, l) })
			free()
			if err != nil && ctx.Err() == nil {
				return // refused for good
			}
		}
	})
}

// abandon records a cleanup that the end of the session cut short, for
// Close to try once more.
func (s *Session) abandon(l leftover) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abandoned[l.name] = l
}

// clean takes our entry out of the queue and reads the lock key (see
// Mutex.leave, which also wakes the waiter linked behind us and repairs the
// tail key), then releases the lock key if our session holds it. Once our
// entry is gone no holder can hand us the lock, so a handoff to us is
// either seen by that read or never happens. The caller holds the name in
// s.names, so that no grant or acquisition of ours uses these keys
// meanwhile.
func (s *Session) clean(ctx context.Context, l leftover) error {
	if l.fn != nil {
		return l.fn(ctx)
	}
	e, err := l.m.leave(ctx)
	switch {
	case err != nil:
		return err
	case e == nil:
	case e.Session == s.id:
		if err := s.releaseKey(ctx, l.m.lockKey()); err != nil && !errors.Is(err, holdfast.ErrNotHeld) {
			return err
		}
	case e.Session == "" && e.Flags == api.LockFlagValue:
		// A free lock key, left by a holder whose session was
		// invalidated: nobody else would delete it, so the last one to
		// give up does, if it is still free (a CAS: someone may be
		// taking it). A lock-delay on it outlives the key in Consul.
		_, _ = s.txn(ctx, api.TxnOps{deleteCAS(l.m.lockKey(), e.ModifyIndex)})
	}
	return nil
}

// repairTail points the tail key, which names an entry of ours that is
// gone, at the live queue entry created last, or deletes it if nobody
// queues: one read of the subtree, then a cas (a waiter that queued
// meanwhile has moved the tail key, and the cas fails: it names a live
// entry then). The cas checks that the entry it names is still there: a
// waiter ahead of us that gave up at the same moment read the tail naming
// us and left it alone, so if its entry went, read again.
func (m *Mutex) repairTail(ctx context.Context) error {
	for range maxLeaveAttempts {
		v, err := m.read(ctx)
		if err != nil {
			return err
		}
		// Dead entries (left by sessions with Behavior release) go too: once
		// the tail key is gone, a contender takes the lock without reading
		// the queue, and they would stay (before: TestRepairTailDropsDead).
		m.s.dropDead(ctx, v.dead)
		if t, ok := m.tailEntry(v.tail); !ok || t.session != m.s.id {
			return nil // gone, or somebody queued since
		}
		if again, err := m.pointTail(ctx, v); !again {
			return err
		}
	}
	return nil
}

// pointTail replaces v.tail, the tail key naming our gone entry, by one
// naming the last live entry of v (none: it deletes it), guarded by both
// being as read. again: that entry went meanwhile, read again.
func (m *Mutex) pointTail(ctx context.Context, v view) (again bool, err error) {
	resp, plain, err := m.sendTail(ctx, m.s.txn, func(plain bool) api.TxnOps {
		ops := api.TxnOps{deleteCAS(m.tailKey(), v.tail.ModifyIndex)}
		if len(v.queue) == 0 {
			return ops
		}
		// Name the last live entry, acquired with its session (see
		// tailSuffix).
		last := v.queue[len(v.queue)-1]
		return append(ops, checkIndex(last.Key, last.ModifyIndex),
			m.tailOps(last.Session, fmt.Appendf(nil, "%s %d", last.Session, last.CreateIndex), plain)[1])
	})
	var rb *rollback
	switch {
	case errors.As(err, &rb) && rb.denied():
		return false, err
	case rb != nil:
		return !rb.failed(0), nil // failed(0): somebody queued since
	case err != nil || !plain:
		return false, err
	}
	last := v.queue[len(v.queue)-1]
	for _, r := range resp.Results {
		if r.KV != nil && r.KV.Key == m.tailKey() {
			m.relockTail(last.Session, last.CreateIndex, r.KV.ModifyIndex)
		}
	}
	return false, nil
}
