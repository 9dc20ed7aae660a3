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

// releaseGuard checks that session holds key, first in every release and
// handoff of a lock key (guard consul/release-check-session).
func releaseGuard(key, session string) api.TxnOps {
	return unless(mutant.On("consul/release-check-session"), checkSession(key, session))
}

// txnGuard checks that session holds key, first in Grant.Txn (guard
// consul/txn-check-session).
func txnGuard(key, session string) api.TxnOps {
	return unless(mutant.On("consul/txn-check-session"), checkSession(key, session))
}

// nextGuard checks that the waiter w a handoff goes to still waits: its
// queue entry is at the index we know (guard consul/handoff-check-next).
func nextGuard(w waiter) api.TxnOps {
	return unless(mutant.On("consul/handoff-check-next"), checkIndex(w.key, w.index))
}

// claimGuard checks that the claim's own session holds its key, first in
// Claim.Txn (guard consul/claim-check-session).
func claimGuard(c *Claim) api.TxnOps {
	return unless(mutant.On("consul/claim-check-session"), c.Guard()...)
}

// proclaimGuard checks that our session holds the leader's key, first in
// Election.Proclaim (guard consul/proclaim-check-session).
func proclaimGuard(g *Grant) api.TxnOps {
	return unless(mutant.On("consul/proclaim-check-session"), g.Guard()...)
}

// multiPartGuard checks that our session holds part p's lock key, in
// MultiGrant.Txn (guard consul/multi-txn-check-session: the last part's).
func multiPartGuard(p *Grant, last bool) api.TxnOps {
	return unless(last && mutant.On("consul/multi-txn-check-session"), p.Guard()...)
}

// permitReleaseGuard checks that session holds our contender key, first in
// a permit's release and Downgrade (guard consul/permit-release-check-session).
func permitReleaseGuard(key, session string) api.TxnOps {
	return unless(mutant.On("consul/permit-release-check-session"), checkSession(key, session))
}

// permitCAS is the verb of every write of a Semaphore's or RWMutex's lock
// key: a check-and-set on the index read (guard consul/permit-cas).
func permitCAS() api.KVOp {
	if mutant.On("consul/permit-cas") {
		return api.KVSet
	}
	return api.KVCAS
}

// writerAlone: an RWMutex's writer is admitted only when nobody holds the
// lock (guard consul/rwmutex-writer-alone).
func writerAlone() bool { return !mutant.On("consul/rwmutex-writer-alone") }

// prunable reports whether holder h of a permit's lock key may be pruned:
// only if its session holds no key under the name (guard
// consul/permit-prune-dead-only).
func prunable(live map[string]bool, h string) bool {
	return !live[h] || mutant.On("consul/permit-prune-dead-only")
}

// semaphoreHeld reports whether e, a lock key of another kind or a key
// under its name, keeps that lock key from being replaced as dead (see
// deadkey.go): a session holds it (guard consul/dead-semaphore-only).
func semaphoreHeld(e *api.KVPair) bool {
	return e.Session != "" && !mutant.On("consul/dead-semaphore-only")
}

// keyCheck: the session checks its held lock keys after every renewal
// (guard consul/key-check).
func keyCheck() bool { return !mutant.On("consul/key-check") }

// sessionWatch: the session follows itself with a blocking query (guard
// consul/session-watch).
func sessionWatch() bool { return !mutant.On("consul/session-watch") }

// claimRecordGuard is the error of a claim of period that the record rec
// refuses (it holds this period or a later one), or nil (guard
// consul/claim-record; the cas on rec's index makes it hold at the write).
func claimRecordGuard(o *Once, period time.Time, rec *api.KVPair) error {
	if mutant.On("consul/claim-record") {
		return nil
	}
	return o.refusedBy(period, rec)
}

// claimPeriodOver reports whether a claim of period, made at now, came
// after the period's end: it must not run (guard consul/claim-period-over).
func claimPeriodOver(period time.Time, every time.Duration, now time.Time) bool {
	return !now.Before(period.Add(every)) && !mutant.On("consul/claim-period-over")
}
