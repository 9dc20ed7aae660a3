package consul

import (
	"context"
	"errors"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// leftover is what a failed acquisition may have left in Consul: our queue
// key, and the lock key if our session may hold it (an acquire whose outcome
// we did not learn, or a handoff to us while we were giving up).
type leftover struct {
	name, lockKey, queueKey string
	// fn, if set, is the cleanup itself (a Semaphore's or RWMutex's: see
	// permits.leave); the keys above are then unused.
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

// abandon records a cleanup that the end of the session cut short, for
// Close to try once more.
func (s *Session) abandon(l leftover) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abandoned[l.name] = l
}

// clean deletes our queue key and reads the lock key in one transaction,
// then releases the lock key if our session holds it. Once the queue key is
// gone no holder can hand us the lock, so a handoff to us is either seen by
// that read or never happens. The caller holds the name in s.names, so that
// no grant or acquisition of ours uses these keys meanwhile.
func (s *Session) clean(ctx context.Context, l leftover) error {
	if l.fn != nil {
		return l.fn(ctx)
	}
	ops := api.TxnOps{kvOp(api.KVDelete, l.queueKey), kvOp(api.KVGetOrEmpty, l.lockKey)}
	resp, err := s.txn(ctx, ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return txnError("clean up "+l.name, rb)
	case err != nil:
		return err
	}
	for _, r := range resp.Results {
		e := r.KV
		switch {
		case e == nil || e.Key != l.lockKey:
		case e.Session == s.id:
			if err := s.releaseKey(ctx, l.lockKey); err != nil && !errors.Is(err, holdfast.ErrNotHeld) {
				return err
			}
		case e.Session == "" && e.ModifyIndex != 0 && e.Flags == api.LockFlagValue:
			// A free lock key, left by a holder whose session was
			// invalidated: nobody else would delete it, so the last one to
			// give up does, if it is still free (a CAS: someone may be
			// taking it). A lock-delay on it outlives the key in Consul.
			_, _ = s.txn(ctx, api.TxnOps{deleteCAS(l.lockKey, e.ModifyIndex)})
		}
	}
	return nil
}
