package consul

import (
	"context"
	"errors"

	"github.com/hashicorp/consul/api"
)

// A campaign (an acquisition with campaign set) waits in the Mutex's queue
// and differs in three places: the head creates the key anew with value
// (takeOps), a handoff from a Mutex holder is retaken with value (handed),
// and the grant resigns instead of handing over (hold); docs/DESIGN.md,
// "Elections", steps 3-5.

// retake takes a lock key handed to us by a Mutex holder (whose value is
// the Mutex's): in one transaction, guarded by our session holding the key,
// it deletes the key and acquires it anew with value. The term is that
// write's index.
func (a *acquisition) retake(ctx context.Context) (uint64, error) {
	m := a.m
	ops := api.TxnOps{
		checkSession(m.lockKey(), m.s.id),
		kvOp(api.KVDelete, m.lockKey()),
		lockOp(m.lockKey(), m.s.id, a.value),
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := a.send(rctx, ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return 0, txnError("campaign on "+m.lockKey(), rb) // the cleanup releases the key
	case err != nil:
		return 0, err
	}
	var term uint64 // the lock operation's entry: the last one (the check-session's comes first)
	for _, r := range resp.Results {
		if r.KV != nil && r.KV.Key == m.lockKey() && r.KV.Session == m.s.id {
			term = r.KV.ModifyIndex
		}
	}
	if term == 0 {
		return 0, errors.New("holdfast/consul: campaign: Consul's answer has no lock entry of ours")
	}
	return term, nil
}
