package conformance_test

import (
	"context"
	"fmt"
	"slices"

	"github.com/holdfast/holdfast"
)

// The fake store's read-write lock and election: a fakeLocker whose keys
// are of another kind (see admitLocked), with the election's history kept
// by the store (fakeStore.leaders).

// fakeRW is a read-write lock: Lock and TryLock write, RLock and TryRLock
// read, through one session and one key.
type fakeRW struct{ *fakeLocker }

func (l fakeRW) RLock(ctx context.Context) (holdfast.Grant, error) {
	return l.acquire(ctx, false, kindRead, nil)
}

func (l fakeRW) TryRLock(ctx context.Context) (holdfast.Grant, error) {
	return l.acquire(ctx, l.st.bug != bugTryLockBlocks, kindRead, nil)
}

// Downgrade turns w, a write grant of l, into a read grant with its key and
// token: the entry becomes a reader's, so the readers queued behind it are
// let in. w ends first, whatever happens next.
func (l fakeRW) Downgrade(ctx context.Context, w holdfast.Grant) (holdfast.Grant, error) {
	st := l.st
	g, ok := w.(*fakeGrant)
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	case !ok || g.l != l.fakeLocker || g.e.kind != kindWrite:
		return nil, fmt.Errorf("%w: not a write grant of %s", holdfast.ErrInvalidArgument, l.name)
	}
	g.mu.Lock()
	if g.count != 1 || g.ending || g.ctx.Err() != nil {
		g.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", holdfast.ErrNotHeld, l.key)
	}
	if err := ctx.Err(); err != nil && st.bug == bugDowngradeKeepsWrite {
		g.mu.Unlock()
		return nil, fmt.Errorf("fake: downgrade %s: %w", l.name, err)
	}
	g.count, g.ending = 0, true
	g.cancel(holdfast.ErrReleased)
	g.mu.Unlock()
	release := func() {
		if l.sess.waitNet(context.Background(), false) == nil {
			st.delete(l.key, g.e)
		}
	}
	if err := ctx.Err(); err != nil {
		g.end(release) // the outcome is unknown: released in the background
		return nil, fmt.Errorf("fake: downgrade %s: %w", l.name, err)
	}
	if err := l.sess.call(ctx, false); err != nil {
		g.end(release)
		return nil, fmt.Errorf("fake: downgrade %s: %w", l.name, err)
	}
	st.mu.Lock()
	if st.keys[l.key] != g.e {
		st.mu.Unlock()
		g.end(func() {})
		return nil, fmt.Errorf("%w: %s was deleted", holdfast.ErrNotHeld, l.key)
	}
	g.e.kind = kindRead
	if st.bug == bugDowngradeNewToken {
		st.rev++
		g.e.token = holdfast.Token(st.rev)
	}
	ng := l.newGrant(g.e)
	st.notifyLocked()
	st.mu.Unlock()
	close(g.finished) // the read grant keeps the key and the slot
	l.mu.Lock()
	l.cur = ng
	l.mu.Unlock()
	return ng, nil
}

// fakeElection is a candidate: Campaign waits in the election's queue with
// value.
type fakeElection struct{ *fakeLocker }

func (e fakeElection) Name() string { return e.name }

func (e fakeElection) Campaign(ctx context.Context, value []byte) (holdfast.Grant, error) {
	return e.acquire(ctx, false, kindElect, value)
}

func (e fakeElection) Leader(ctx context.Context) (holdfast.Leader, error) {
	if err := e.sess.call(ctx, false); err != nil {
		return holdfast.Leader{}, fmt.Errorf("fake: leader of %s: %w", e.name, err)
	}
	e.st.mu.Lock()
	l := e.st.leaderLocked(e.name)
	e.st.mu.Unlock()
	if l.None() && e.st.bug != bugLeaderNoError {
		return l, fmt.Errorf("fake: %s: %w", e.name, holdfast.ErrNoLeader)
	}
	return l, nil
}

// Observe delivers the election's history from its current state on, every
// entry in order, however slow the reader: entries wait in a queue.
func (e fakeElection) Observe(ctx context.Context) <-chan holdfast.Leader {
	st := e.st
	ch := make(chan holdfast.Leader)
	st.mu.Lock()
	next := len(st.leaders[e.name])
	pending := []holdfast.Leader{st.leaderLocked(e.name)}
	changed := st.changed
	st.mu.Unlock()
	go func() {
		defer close(ch)
		for {
			pending = slices.DeleteFunc(pending, func(l holdfast.Leader) bool {
				return l.None() && st.bug == bugObserveNoNone
			})
			var out chan holdfast.Leader
			var l holdfast.Leader
			i := 0
			if len(pending) > 0 {
				out = ch
				switch st.bug {
				case bugObserveOutOfOrder, bugObserveSkips:
					i = len(pending) - 1
				}
				l = pending[i]
			}
			select {
			case out <- l:
				if st.bug == bugObserveSkips {
					pending = pending[:0]
				} else {
					pending = slices.Delete(pending, i, i+1)
				}
			case <-changed:
				st.mu.Lock()
				h := st.leaders[e.name]
				pending = append(pending, h[next:]...)
				next = len(h)
				changed = st.changed
				st.mu.Unlock()
			case <-ctx.Done():
				return
			case <-e.sess.ctx.Done():
				return
			}
		}
	}()
	return ch
}
