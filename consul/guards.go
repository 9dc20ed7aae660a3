package consul

import (
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/internal/mutant"
)

// The guards of the Consul backend (docs/GUARDS.md). The build with the tag
// holdfast_mutants removes the one HOLDFAST_MUTANT names; in a normal build
// mutant.On is a constant false.

// unless is ops, or nothing if removed.
func unless(removed bool, ops ...*api.TxnOp) api.TxnOps {
	if removed {
		return nil
	}
	return ops
}

// The checks that a session holds a key: ours, first in every release and
// handoff of a lock key, in Grant.Txn, Election.Proclaim, each part of
// MultiGrant.Txn (the mutant removes the last part's) and a permit's release
// and Downgrade; the claim's own in Claim.Txn.
func releaseGuard(key, session string) api.TxnOps {
	return unless(mutant.On("consul/release-check-session"), checkSession(key, session))
}
func txnGuard(key, session string) api.TxnOps {
	return unless(mutant.On("consul/txn-check-session"), checkSession(key, session))
}
func proclaimGuard(g *Grant) api.TxnOps {
	return unless(mutant.On("consul/proclaim-check-session"), g.Guard()...)
}
func multiPartGuard(p *Grant, last bool) api.TxnOps {
	return unless(last && mutant.On("consul/multi-txn-check-session"), p.Guard()...)
}
func permitReleaseGuard(key, session string) api.TxnOps {
	return unless(mutant.On("consul/permit-release-check-session"), checkSession(key, session))
}
func claimGuard(c *Claim) api.TxnOps {
	return unless(mutant.On("consul/claim-check-session"), c.Guard()...)
}

// nextGuard: the waiter a handoff goes to still waits, its queue entry at
// the index we know (consul/handoff-check-next).
func nextGuard(w waiter) api.TxnOps {
	return unless(mutant.On("consul/handoff-check-next"), checkIndex(w.key, w.index))
}

// permitCAS is the verb of every write of a permit's lock key: a cas on the
// index read (consul/permit-cas).
func permitCAS() api.KVOp {
	if mutant.On("consul/permit-cas") {
		return api.KVSet
	}
	return api.KVCAS
}

// writerAlone: an RWMutex's writer is admitted only when nobody holds the
// lock (consul/rwmutex-writer-alone).
func writerAlone() bool { return !mutant.On("consul/rwmutex-writer-alone") }

// prunable: holder h of a permit's lock key may be pruned only if its
// session holds no key under the name (consul/permit-prune-dead-only).
func prunable(live map[string]bool, h string) bool {
	return !live[h] || mutant.On("consul/permit-prune-dead-only")
}

// semaphoreHeld: e, a lock key of another kind or a key under its name, is
// held, so that lock key is not dead (consul/dead-semaphore-only).
func semaphoreHeld(e *api.KVPair) bool {
	return e.Session != "" && !mutant.On("consul/dead-semaphore-only")
}

// keyCheck: the session checks its held keys after every renewal
// (consul/key-check); sessionWatch: it follows itself with a blocking
// query (consul/session-watch).
func keyCheck() bool     { return !mutant.On("consul/key-check") }
func sessionWatch() bool { return !mutant.On("consul/session-watch") }

// claimRecordGuard: the error of a claim of period that the record rec
// refuses, or nil (consul/claim-record; the cas on rec's index holds it).
func claimRecordGuard(o *Once, period time.Time, rec *api.KVPair) error {
	if mutant.On("consul/claim-record") {
		return nil
	}
	return o.refusedBy(period, rec)
}

// claimPeriodOver: a claim of period made at now came after the period's
// end, and must not run (consul/claim-period-over).
func claimPeriodOver(period time.Time, every time.Duration, now time.Time) bool {
	return !now.Before(period.Add(every)) && !mutant.On("consul/claim-period-over")
}
