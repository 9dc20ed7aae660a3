package consul

import (
	"context"
	"errors"

	"github.com/hashicorp/consul/api"
)

// campaign is how an Election's Campaign takes the lock key: it waits in
// the Mutex's queue (queue.go: acquisition.run, whose steps it shares) and
// differs only in what it writes and how its grant ends:
//
//  1. Join and wait as a Mutex's Lock (queue.go, steps 1 to 4).
//  2. Take office at the head of the queue, when the key is free (step 6):
//     create the key anew with value, the leader's proposal: a delete-cas
//     of the free key as seen (or a check that it is absent) and an
//     acquire, in one txn. So the key's LockIndex is 1 and the term (the
//     acquire's ModifyIndex) stays readable as its CreateIndex after
//     Proclaim.
//  3. Handed the key by a Mutex holder (step 5): retake it, deleting and
//     re-creating it with value (a new term).
//  4. Resign (the grant's Unlock: lockHold with resign): a guarded delete of
//     the key with our entry, never a handoff; the waiter linked behind us
//     is woken (its anchor on us is deleted) and takes it at step 2.
func campaign(value []byte) taking {
	return taking{
		write: func(m *Mutex, seen *api.KVPair) api.TxnOps {
			guard := kvOp(api.KVCheckNotExists, m.lockKey)
			if seen != nil {
				guard = deleteCAS(m.lockKey, seen.ModifyIndex)
			}
			return api.TxnOps{guard, lockOp(m.lockKey, m.s.id, value)}
		},
		handed: func(ctx context.Context, a *acquisition, _ uint64) (uint64, error) {
			return retake(ctx, a, value)
		},
		resign: true,
	}
}

// retake takes a lock key handed to us by a Mutex holder (whose value is
// the Mutex's): in one transaction, guarded by our session holding the key,
// it deletes the key and acquires it anew with value. The term is that
// write's index.
func retake(ctx context.Context, a *acquisition, value []byte) (uint64, error) {
	m := a.m
	ops := api.TxnOps{
		checkSession(m.lockKey, m.s.id),
		kvOp(api.KVDelete, m.lockKey),
		lockOp(m.lockKey, m.s.id, value),
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := a.send(rctx, ops)
	var rb *rollback
	switch {
	case errors.As(err, &rb):
		return 0, txnError("campaign on "+m.lockKey, rb) // the cleanup releases the key
	case err != nil:
		return 0, err
	}
	var term uint64 // the lock operation's entry: the last one (the check-session's comes first)
	for _, r := range resp.Results {
		if r.KV != nil && r.KV.Key == m.lockKey && r.KV.Session == m.s.id {
			term = r.KV.ModifyIndex
		}
	}
	if term == 0 {
		return 0, errors.New("holdfast/consul: campaign: Consul's answer has no lock entry of ours")
	}
	return term, nil
}
