package safety

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
)

// Workload is a set of clients that take one lock in turn and write to a
// fenced resource while they hold it, recording everything.
type Workload struct {
	// Clients is how many clients run (default 4).
	Clients int
	// Writes bounds how many fenced writes a client makes per grant (a
	// random number from 1 to Writes; default 2), pausing Hold between
	// them (default 10 ms). A client stops writing once its grant's context
	// is done.
	Writes int
	Hold   time.Duration
	// LongHolds is the fraction of grants (0 to 1) held for LongHold
	// instead, writing every Hold until LongHold has passed or the grant
	// ends: holders that a fault is likely to cut off while they hold, as
	// a batch job's would be.
	LongHolds float64
	LongHold  time.Duration
	// LockTimeout bounds each Lock (default 10 s).
	LockTimeout time.Duration
	// NewLocker opens a new session for client and returns the lock on it
	// and a function that closes the session. The workload calls it again
	// after the session was lost.
	NewLocker func(ctx context.Context, client int) (holdfast.Locker, func(), error)

	Resource *Resource
	History  *History
	Tracker  *Tracker
}

// Stats counts what a workload did.
type Stats struct {
	Grants, LockFailures, Writes, Rejected, Lost, Sessions int
}

func (s *Stats) add(o Stats) {
	s.Grants += o.Grants
	s.LockFailures += o.LockFailures
	s.Writes += o.Writes
	s.Rejected += o.Rejected
	s.Lost += o.Lost
	s.Sessions += o.Sessions
}

// Run runs the clients until ctx ends, then closes their sessions.
func (w *Workload) Run(ctx context.Context) Stats {
	clients := w.Clients
	if clients == 0 {
		clients = 4
	}
	var mu sync.Mutex
	var total Stats
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := w.client(ctx, c)
			mu.Lock()
			total.add(st)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total
}

func (w *Workload) client(ctx context.Context, c int) Stats {
	writes, hold, lockTimeout := w.Writes, w.Hold, w.LockTimeout
	if writes == 0 {
		writes = 2
	}
	if hold == 0 {
		hold = 10 * time.Millisecond
	}
	if lockTimeout == 0 {
		lockTimeout = 10 * time.Second
	}
	h := w.History
	var st Stats
	var l holdfast.Locker
	closeFn := func() {}
	defer func() { closeFn() }()
	for ctx.Err() == nil {
		if l == nil {
			var err error
			if l, closeFn, err = w.NewLocker(ctx, c); err != nil {
				l, closeFn = nil, func() {}
				sleep(ctx, 100*time.Millisecond)
				continue
			}
			st.Sessions++
		}
		lctx, cancel := context.WithTimeout(ctx, lockTimeout)
		call := h.Now()
		g, err := l.Lock(lctx)
		ret := h.Now()
		cancel()
		if err != nil {
			h.Add(Op{Client: c, Kind: Acquire, Call: call, Return: ret})
			st.LockFailures++
			if errors.Is(err, holdfast.ErrSessionLost) || errors.Is(err, holdfast.ErrSessionClosed) {
				closeFn()
				l, closeFn = nil, func() {}
			} else {
				sleep(ctx, 50*time.Millisecond)
			}
			continue
		}
		h.Add(Op{Client: c, Kind: Acquire, Token: g.Token(), OK: true, Call: call, Return: ret})
		st.Grants++
		w.Tracker.Granted(c, g)
		token := g.Token()
		context.AfterFunc(g.Context(), func() {
			at := h.Now()
			h.Add(Op{Client: c, Kind: End, Token: token, OK: true, Call: at, Return: at})
		})
		n, until := 1+rand.IntN(writes), time.Time{}
		if w.LongHolds > 0 && rand.Float64() < w.LongHolds {
			n, until = -1, time.Now().Add(w.LongHold)
		}
		for i := 0; i != n && ctx.Err() == nil && (until.IsZero() || time.Now().Before(until)); i++ {
			if g.Context().Err() != nil {
				break
			}
			call := h.Now()
			err := w.Resource.Write(c, g.Token())
			h.Add(Op{Client: c, Kind: Put, Token: g.Token(), OK: err == nil, Call: call, Return: h.Now()})
			st.Writes++
			if err != nil {
				st.Rejected++
			}
			sleep(ctx, hold)
		}
		lost := g.Context().Err() != nil
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		call = h.Now()
		err = g.Unlock(uctx)
		h.Add(Op{Client: c, Kind: Release, Token: g.Token(), OK: err == nil, Call: call, Return: h.Now()})
		cancel()
		w.Tracker.Ended(c)
		if lost {
			st.Lost++
		}
		if errors.Is(context.Cause(g.Context()), holdfast.ErrSessionLost) {
			closeFn()
			l, closeFn = nil, func() {}
		}
	}
	return st
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
