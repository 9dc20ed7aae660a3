package etcd

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// Grant is a held etcd lock. It implements holdfast.Grant; its token is the
// create revision of its key.
type Grant struct {
	base   *core.Grant // key, token, context, reentrancy, release
	client *clientv3.Client
	rev    int64
}

var _ holdfast.Grant = (*Grant)(nil)

// Key implements holdfast.Grant.
func (g *Grant) Key() string { return g.base.Key() }

// Token implements holdfast.Grant.
func (g *Grant) Token() holdfast.Token { return g.base.Token() }

// Context implements holdfast.Grant.
func (g *Grant) Context() context.Context { return g.base.Context() }

// Deadline implements holdfast.Grant.
func (g *Grant) Deadline() time.Time { return g.base.Deadline() }

// Unlock implements holdfast.Grant.
func (g *Grant) Unlock(ctx context.Context) error { return g.base.Unlock(ctx) }

// Guard returns the comparison that holds exactly while this grant does: our
// key still exists with our create revision. Put it in the If of your own
// transactions; Txn does it for you.
func (g *Grant) Guard() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(g.Key()), "=", g.rev)
}

// Txn runs ops in one etcd transaction that commits only while the grant is
// held. If the grant was released or lost (locally or in etcd), it applies
// nothing and returns an error wrapping holdfast.ErrNotHeld.
func (g *Grant) Txn(ctx context.Context, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", holdfast.ErrInvalidArgument)
	}
	if !g.base.Held() {
		return nil, fmt.Errorf("%w: %s", holdfast.ErrNotHeld, g.Key())
	}
	resp, err := g.client.Txn(ctx).If(g.Guard()).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("holdfast/etcd: guarded txn on %s: %w", g.Key(), err)
	}
	if !resp.Succeeded {
		g.base.Lose(fmt.Errorf("%w: %s no longer has create revision %d", holdfast.ErrLost, g.Key(), g.rev))
		return nil, fmt.Errorf("%w: %s", holdfast.ErrNotHeld, g.Key())
	}
	return resp, nil
}

// watch cancels the grant as soon as its key is deleted (the lease revoked by
// an operator, the key removed by hand), rather than at the next keepalive.
// It ends with the grant.
func (g *Grant) watch() {
	if g.Context().Err() != nil {
		return
	}
	ctx := clientv3.WithRequireLeader(g.Context())
	pause := 50 * time.Millisecond
	for ctx.Err() == nil {
		for wr := range g.client.Watch(ctx, g.Key(), clientv3.WithRev(g.rev+1)) {
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					g.base.Lose(fmt.Errorf("%w: %s was deleted (lease revoked or key removed)", holdfast.ErrLost, g.Key()))
					return
				}
			}
			if wr.CompactRevision != 0 {
				g.check(ctx)
			}
		}
		if ctx.Err() != nil {
			return // released or lost
		}
		// The watch ended (member without leader, compaction): check the key
		// once and watch again.
		g.check(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(pause):
			pause = min(2*pause, time.Second)
		}
	}
}

// check cancels the grant if its key no longer has its create revision.
func (g *Grant) check(ctx context.Context) {
	resp, err := g.client.Get(ctx, g.Key())
	if err != nil {
		return // the keepalive deadline covers an unreachable store
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != g.rev {
		g.base.Lose(fmt.Errorf("%w: %s no longer has create revision %d", holdfast.ErrLost, g.Key(), g.rev))
	}
}

// release is the guarded delete behind Unlock.
func (g *Grant) release(ctx context.Context) error {
	resp, err := g.client.Txn(ctx).If(g.Guard()).Then(clientv3.OpDelete(g.Key())).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s no longer has create revision %d", holdfast.ErrNotHeld, g.Key(), g.rev)
	}
	return nil
}
