package consul

import (
	"context"
	"errors"

	"github.com/hashicorp/consul/api"
)

// A campaign (an acquisition with a value) waits in the Mutex's queue and
// differs in three places: the take creates the key anew with the value
// (takeOps), a handoff from a Mutex holder is retaken (handed), and its
// release resigns instead of handing over (acquisition.handOver);
// docs/DESIGN.md, "Elections", steps 3-5.

// takeOps returns the operations that take the lock key as seen (nil if
// absent): a guard that it is still so, and the acquire with our value. A
// campaign deletes a free key as seen and creates it anew.
func (a *acquisition) takeOps(seen *api.KVPair) api.TxnOps {
	key, value := a.m.lockKey(), []byte(valueTaken)
	guard := kvOp(api.KVCheckNotExists, key)
	switch {
	case a.campaign() && seen != nil:
		guard = deleteCAS(key, seen.ModifyIndex)
	case seen != nil:
		guard = checkIndex(key, seen.ModifyIndex)
	}
	if a.campaign() {
		value = a.value
	}
	return api.TxnOps{guard, lockOp(key, a.m.s.id, value)}
}

// handed accepts the lock key handed to us with token (step 5) and returns
// the grant's token: a campaign retakes it.
func (a *acquisition) handed(ctx context.Context, token uint64) (uint64, error) {
	if !a.campaign() {
		return token, nil
	}
	m := a.m
	// One transaction guarded by our session holding the key deletes it and
	// acquires it anew with our value; the term is that write's index.
	resp, err := a.send(ctx, api.TxnOps{
		checkSession(m.lockKey(), m.s.id), kvOp(api.KVDelete, m.lockKey()), lockOp(m.lockKey(), m.s.id, a.value),
	})
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return 0, txnError("campaign on "+m.lockKey(), rb) // the cleanup releases the key
	case err != nil:
		return 0, err
	}
	lock := m.parse(txnKVs(resp.Results)).lock // the lock operation's answer: the last one
	if lock == nil || lock.Session != m.s.id {
		return 0, errors.New("holdfast/consul: campaign: Consul's answer has no lock entry of ours")
	}
	return lock.ModifyIndex, nil
}
