//go:build holdfast_mutants

package consul

import (
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
	return api.TxnOps{checkSession(w.key, w.session), checkIndex(w.key, w.index)}
}
