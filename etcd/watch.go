package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// watcher watches the keys of every grant of a session on ONE etcd watch
// stream, so that a revoked lease or a deleted key is noticed within
// milliseconds at the cost of no goroutine per grant. It owns two
// goroutines per session: one receives from the stream (and reconnects it),
// one sends the requests queued by grants (creates and cancels), so that a
// grant never waits on the network to start or stop being watched.
//
// Watch IDs are ours (WatchCreateRequest.WatchId), so a response maps to its
// grant without waiting for the server to name the watch. On a reconnection
// every watch is created again, under the same ID, from its grant's resume
// revision (rev+1 at first), so no deletion is missed while the stream was
// down. A watch cancelled because its revision was compacted is resumed,
// under a new ID, from a revision that exists, after one read of the key
// (see recheck).
type watcher struct {
	s *Session

	mu     sync.Mutex
	nextID int64
	grants map[int64]*Grant
	queue  []*pb.WatchRequest // requests for the current stream, not yet sent
	gen    int64              // stream generation: bumped at each (re)connection
	wake   chan struct{}      // capacity 1: the queue has requests

	creates atomic.Int64       // watch creations queued, for tests
	created atomic.Int64       // watch creations confirmed, for tests
	cancel  context.CancelFunc // of the current stream (under mu), for tests
	done    chan struct{}
}

func newWatcher(s *Session) *watcher {
	w := &watcher{s: s, nextID: 1, grants: map[int64]*Grant{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go w.run(s.keeper.Context())
	return w
}

// add starts watching g's key from g's resume revision.
func (w *watcher) add(g *Grant) {
	w.mu.Lock()
	if g.unwatched { // the grant ended already
		w.mu.Unlock()
		return
	}
	g.watchID = w.nextID
	w.nextID++
	w.grants[g.watchID] = g
	w.queue = append(w.queue, w.createReq(g))
	w.mu.Unlock()
	w.signal()
}

// remove stops watching g's key.
func (w *watcher) remove(g *Grant) {
	w.mu.Lock()
	g.unwatched = true
	if w.grants[g.watchID] == g {
		delete(w.grants, g.watchID)
		w.queue = append(w.queue, cancelReq(g.watchID))
	}
	w.mu.Unlock()
	w.signal()
}

// createReq is the request that watches g's key for deletion, from g.from.
// Call with w.mu held.
func (w *watcher) createReq(g *Grant) *pb.WatchRequest {
	w.creates.Add(1)
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
		Key:           []byte(g.Key()),
		StartRevision: g.from,
		WatchId:       g.watchID,
		Filters:       []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT},
	}}}
}

func cancelReq(id int64) *pb.WatchRequest {
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: id}}}
}

func (w *watcher) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run keeps a watch stream open while the session lives, reconnecting with
// the backends' one backoff (core.Backoff) when it breaks; a stream that
// lasted streamLasted starts the backoff afresh.
func (w *watcher) run(ctx context.Context) {
	defer close(w.done)
	for ctx.Err() == nil {
		_ = core.Backoff{}.Retry(ctx, func(ctx context.Context) error {
			start := time.Now()
			w.stream(ctx)
			if time.Since(start) > streamLasted {
				return nil
			}
			return errStreamBroke
		})
	}
}

// streamLasted is how long a watch stream must have run for its end to
// count as a new failure rather than one more of a series.
const streamLasted = 5 * time.Second

var errStreamBroke = errors.New("watch stream broke")

// stream runs one watch stream until it fails or ctx ends. The stream
// requires a leader: a member cut off from the quorum closes it, and the
// next one may reach a member that has one.
func (w *watcher) stream(ctx context.Context) {
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	st, err := pb.NewWatchClient(w.s.client.ActiveConnection()).Watch(sctx)
	if err != nil {
		return
	}
	w.mu.Lock()
	w.gen++
	gen := w.gen
	w.cancel = cancel
	w.queue = w.queue[:0]
	for _, g := range w.grants {
		w.queue = append(w.queue, w.createReq(g))
	}
	w.mu.Unlock()
	w.signal()
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		w.send(sctx, cancel, st)
	}()
	defer func() { cancel(); <-sent }() // the sender stops with the stream
	for {
		resp, err := st.Recv()
		if err != nil {
			return
		}
		w.dispatch(gen, resp)
	}
}

// send sends the queued requests on st until ctx ends or a send fails (then
// it cancels the stream, so that it is reconnected).
func (w *watcher) send(ctx context.Context, cancel context.CancelFunc, st pb.Watch_WatchClient) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
		w.mu.Lock()
		reqs := w.queue
		w.queue = nil
		w.mu.Unlock()
		for _, r := range reqs {
			if err := st.Send(r); err != nil {
				cancel()
				return
			}
		}
	}
}

// dispatch acts on one response of stream generation gen.
func (w *watcher) dispatch(gen int64, resp *pb.WatchResponse) {
	if resp.Created && !resp.Canceled {
		w.created.Add(1)
	}
	w.mu.Lock()
	g := w.grants[resp.WatchId]
	w.mu.Unlock()
	if g == nil {
		return // released: its cancel is on its way
	}
	for _, ev := range resp.Events {
		if ev.Type == mvccpb.DELETE {
			g.base.Lose(fmt.Errorf("%w: %s was deleted (lease revoked or key removed)", holdfast.ErrLost, g.Key()))
			return
		}
	}
	if resp.Canceled {
		// Compacted past the resume revision (or cancelled by the server for
		// another reason): read the key once, then watch again from a
		// revision that exists.
		w.s.bg.Go(func(ctx context.Context) { w.recheck(ctx, gen, g) })
	}
}

// recheck reads g's key once (retrying transport errors while the grant
// lives): if it is gone or has another create revision, the grant is lost;
// otherwise the watch is created again from the read's revision + 1, which
// exists, so a compaction cannot cancel it at once again.
func (w *watcher) recheck(ctx context.Context, gen int64, g *Grant) {
	ctx, stop := core.Bind(ctx, g.Context())
	defer stop()
	_ = core.Retry(ctx, func(actx context.Context) error {
		resp, err := w.s.client.Get(actx, g.Key())
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != g.rev {
			g.base.Lose(fmt.Errorf("%w: %s no longer has create revision %d", holdfast.ErrLost, g.Key(), g.rev))
			return nil
		}
		w.mu.Lock()
		g.from = resp.Header.Revision + 1
		if w.grants[g.watchID] == g && w.gen == gen { // else the new stream created it
			// The server keeps a cancelled watch's ID until the client
			// cancels it: free it, and watch under a new ID.
			w.queue = append(w.queue, cancelReq(g.watchID))
			delete(w.grants, g.watchID)
			g.watchID = w.nextID
			w.nextID++
			w.grants[g.watchID] = g
			w.queue = append(w.queue, w.createReq(g))
		}
		w.mu.Unlock()
		w.signal()
		return nil
	})
}
