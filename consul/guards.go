//go:build !holdfast_mutants

package consul

import "github.com/hashicorp/consul/api"

// The guards of a Mutex's grant (docs/GUARDS.md), as the algorithms use
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
// its session holds its queue entry, at the index we know (guard
// consul/handoff-check-next).
func nextGuard(w waiter) api.TxnOps {
	return api.TxnOps{checkSession(w.key, w.session), checkIndex(w.key, w.index)}
}
