package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// Grant is a held etcd lock. It implements holdfast.Grant; its token is the
// create revision of its key.
type Grant struct {
	*core.Grant
	client *clientv3.Client
	rev    int64
}

var _ holdfast.Grant = (*Grant)(nil)

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
	if !g.Held() {
		return nil, fmt.Errorf("%w: %s", holdfast.ErrNotHeld, g.Key())
	}
	resp, err := g.client.Txn(ctx).If(g.Guard()).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("holdfast/etcd: guarded txn on %s: %w", g.Key(), err)
	}
	if !resp.Succeeded {
		g.Lose(fmt.Errorf("%w: %s no longer has create revision %d", holdfast.ErrLost, g.Key(), g.rev))
		return nil, fmt.Errorf("%w: %s", holdfast.ErrNotHeld, g.Key())
	}
	return resp, nil
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
