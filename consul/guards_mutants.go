//go:build holdfast_mutants

package consul

import (
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/internal/mutant"
)

// The guards of guards.go, each removable by HOLDFAST_MUTANT (see
// internal/mutant and docs/GUARDS.md).

func releaseGuard(key, session string) api.TxnOps {
	if mutant.On("consul/release-check-session") {
		return nil
	}
	return api.TxnOps{checkSession(key, session)}
}

func txnGuard(key, session string) api.TxnOps {
	if mutant.On("consul/txn-check-session") {
		return nil
	}
	return api.TxnOps{checkSession(key, session)}
}

func nextGuard(w waiter) api.TxnOps {
	if mutant.On("consul/handoff-check-next") {
		return nil
	}
	return api.TxnOps{checkIndex(w.key, w.index)}
}

func claimGuard(c *Claim) api.TxnOps {
	if mutant.On("consul/claim-check-session") {
		return nil
	}
	return c.Guard()
}

func proclaimGuard(g *Grant) api.TxnOps {
	if mutant.On("consul/proclaim-check-session") {
		return nil
	}
	return g.Guard()
}

func multiPartGuard(p *Grant, last bool) api.TxnOps {
	if last && mutant.On("consul/multi-txn-check-session") {
		return nil // the last part unguarded
	}
	return p.Guard()
}

func permitReleaseGuard(key, session string) api.TxnOps {
	if mutant.On("consul/permit-release-check-session") {
		return nil
	}
	return api.TxnOps{checkSession(key, session)}
}

func permitCAS() api.KVOp {
	if mutant.On("consul/permit-cas") {
		return api.KVSet
	}
	return api.KVCAS
}

func writerAlone() bool { return !mutant.On("consul/rwmutex-writer-alone") }

func prunable(live map[string]bool, h string) bool {
	return !live[h] || mutant.On("consul/permit-prune-dead-only")
}

func semaphoreHeld(e *api.KVPair) bool {
	return e.Session != "" && !mutant.On("consul/dead-semaphore-only")
}

func keyCheck() bool { return !mutant.On("consul/key-check") }

func sessionWatch() bool { return !mutant.On("consul/session-watch") }

func claimRecordGuard(o *Once, period time.Time, rec *api.KVPair) error {
	if mutant.On("consul/claim-record") {
		return nil
	}
	return o.refusedBy(period, rec)
}

func claimPeriodOver(period time.Time, every time.Duration, now time.Time) bool {
	if mutant.On("consul/claim-period-over") {
		return false
	}
	return !now.Before(period.Add(every))
}
