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

// leftover is what a failed acquisition of name may have left in Consul,
// and how to remove it (Mutex.clean, or a permit's leave).
type leftover struct {
	name  string
	clean func(context.Context) error
}

// cleanUp removes l in the session's background, retried until Consul
// answers, then frees the name's slot (free) and closes the channel. If
// the session ends first: one last bounded attempt, then Close tries.
func (s *Session) cleanUp(l leftover, free func()) <-chan struct{} {
	done := make(chan struct{})
	task := func(ctx context.Context) {
		defer close(done)
		defer free()
		err := core.Retry(ctx, l.clean)
		if err == nil || ctx.Err() == nil {
			return // done, or refused for good
		}
		// The session ended: a queue key left by a session with Behavior
		// release would stay in Consul.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), core.AttemptTimeout)
		defer cancel()
		if l.clean(actx) != nil {
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

// errSweepAgain: a sweep is over, the next one comes after the next pause.
var errSweepAgain = errors.New("sweep again")

// sweeps paces Session.sweepLater: 7 sweeps, the last 15.75 s after the first.
var sweeps = core.Backoff{First: 250 * time.Millisecond, Max: 10 * time.Second, Tries: 7, Final: func(err error) bool { return err != errSweepAgain }}

// sweepLater runs l's cleanup again, paced by sweeps, for a write of a
// failed acquisition that got no answer and may land after the first
// cleanup; each sweep takes the name's slot and is retried until Consul
// answers, while the session lives (docs/DESIGN.md, "Consul acquire").
func (s *Session) sweepLater(l leftover) {
	s.abandon(l) // and Close sweeps once more, for a request that lands later still
	s.bg.Go(func(ctx context.Context) {
		_ = sweeps.Retry(ctx, func(ctx context.Context) error {
			free, err := s.names.Acquire(ctx, l.name)
			if err != nil {
				return err
			}
			defer free()
			if err := core.Retry(ctx, l.clean); err != nil && ctx.Err() == nil {
				return err // refused for good
			}
			return errSweepAgain
		})
	})
}

// abandon records a cleanup that the end of the session cut short, for
// Close to try once more.
func (s *Session) abandon(l leftover) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abandoned[l.name] = l
}

// clean takes our entry out of the queue (Mutex.leave), then releases the
// lock key if our session holds it: with our entry gone, no handoff to us
// can follow. The caller holds the name's slot.
func (m *Mutex) clean(ctx context.Context) error {
	e, err := m.leave(ctx)
	switch {
	case err != nil:
		return err
	case e == nil:
	case e.Session == m.s.id:
		if err := m.s.releaseKey(ctx, m.lockKey()); err != nil && !errors.Is(err, holdfast.ErrNotHeld) {
			return err
		}
	case e.Session == "" && e.Flags == api.LockFlagValue:
		// A free lock key of an invalidated holder: the last one to
		// give up deletes it, if still free (its lock-delay outlives it).
		_, _ = m.s.txn(ctx, api.TxnOps{deleteCAS(m.lockKey(), e.ModifyIndex)})
	}
	return nil
}

// repairTail points the tail key, which names our gone entry, at the last
// live queue entry, or deletes it if nobody queues: a read, then a cas
// (pointTail) repeated while the entry it would name goes meanwhile.
func (m *Mutex) repairTail(ctx context.Context) error {
	for range maxLeaveAttempts {
		v, err := m.read(ctx)
		if err != nil {
			return err
		}
		// read drops dead entries: once the tail key is gone, nobody
		// reads the queue before taking the lock (TestRepairTailDropsDead).
		if t, ok := m.tailEntry(v.tail); !ok || t.session != m.s.id {
			return nil // gone, or somebody queued since
		}
		if again, err := m.pointTail(ctx, v); !again {
			return err
		}
	}
	return nil
}

// pointTail replaces v.tail by a tail key naming the last live entry of v
// (none: deletes it), guarded by both as read. again: that entry went.
func (m *Mutex) pointTail(ctx context.Context, v view) (again bool, err error) {
	resp, plain, err := m.sendTail(ctx, m.s.txn, func(plain bool) api.TxnOps {
		ops := api.TxnOps{deleteCAS(m.tailKey(), v.tail.ModifyIndex)}
		if len(v.queue) == 0 {
			return ops
		}
		// acquired with the entry's session (see tailSuffix)
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
