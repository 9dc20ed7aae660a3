//go:build !holdfast_mutants

package consul

import (
	"time"

	"github.com/hashicorp/consul/api"
)

// The guards of the Consul backend (docs/GUARDS.md), as the algorithms use
// them. The build with the tag holdfast_mutants can remove each one (see
// guards_mutants.go); a normal build pays nothing for that.

// releaseGuard is the check that session still holds key, first in every
// release and handoff of a lock key (guard consul/release-check-session).
func releaseGuard(key, session string) api.TxnOps {
	return api.TxnOps{checkSession(key, session)}
}

// txnGuard is the check that session still holds key, first in a grant's
// guarded transaction (guard consul/txn-check-session).
func txnGuard(key, session string) api.TxnOps {
	return api.TxnOps{checkSession(key, session)}
}

// nextGuard is the check that the waiter w a handoff goes to still waits:
// its queue entry is at the index we know, which it leaves when its session
// ends (Behavior delete deletes it, release frees it: a write either way)
// or it leaves the queue (guard consul/handoff-check-next).
func nextGuard(w waiter) api.TxnOps {
	return api.TxnOps{checkIndex(w.key, w.index)}
}

// claimGuard is the check that the claim's own session holds its key,
// first in Claim.Txn (guard consul/claim-check-session).
func claimGuard(c *Claim) api.TxnOps { return c.Guard() }

// proclaimGuard is the check that our session holds the leader's key,
// first in Election.Proclaim (guard consul/proclaim-check-session).
func proclaimGuard(g *Grant) api.TxnOps { return g.Guard() }

// multiPartGuard is the check that our session holds part p's lock key, one
// per part in MultiGrant.Txn (guard consul/multi-txn-check-session).
func multiPartGuard(p *Grant, last bool) api.TxnOps { return p.Guard() }

// permitReleaseGuard is the check that session holds our contender key,
// first in a permit's release and Downgrade (guard
// consul/permit-release-check-session).
func permitReleaseGuard(key, session string) api.TxnOps {
	return api.TxnOps{checkSession(key, session)}
}

// permitCAS is the verb of every write of a Semaphore's or RWMutex's lock
// key: a check-and-set on the index it was read at (guard
// consul/permit-cas).
func permitCAS() api.KVOp { return api.KVCAS }

// writerAlone says that an RWMutex's writer is admitted only when nobody
// holds the lock (guard consul/rwmutex-writer-alone).
func writerAlone() bool { return true }

// prunable reports whether holder h of a permit's lock key may be pruned:
// only if its session holds no key under the name (guard
// consul/permit-prune-dead-only).
func prunable(live map[string]bool, h string) bool { return !live[h] }

// semaphoreHeld reports whether e, a name's lock key of another kind (a
// semaphore's, an RWMutex's) or a key under that name, keeps the lock key
// from being replaced as dead (see deadkey.go): it is held by a session, a
// live holder's or waiter's (guard consul/dead-semaphore-only).
func semaphoreHeld(e *api.KVPair) bool { return e.Session != "" }

// keyCheck says that the session checks its held lock keys after every
// renewal (guard consul/key-check).
func keyCheck() bool { return true }

// sessionWatch says that the session follows itself with a blocking query
// (guard consul/session-watch).
func sessionWatch() bool { return true }

// claimRecordGuard returns the error of a claim of period that the record
// rec refuses (it holds this period or a later one), or nil (guard
// consul/claim-record; the cas on rec's index then makes it hold).
func claimRecordGuard(o *Once, period time.Time, rec *api.KVPair) error {
	return o.refusedBy(period, rec)
}

// claimPeriodOver reports whether a claim of period, made at now, came
// after the period's end: it must not run (guard consul/claim-period-over).
func claimPeriodOver(period time.Time, every time.Duration, now time.Time) bool {
	return !now.Before(period.Add(every))
}
