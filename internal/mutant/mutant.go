//go:build !holdfast_mutants

// Package mutant removes one safety guard at a time, for `make mutants`: the
// check that the test suite notices when a guard is gone. Guards test On
// inline, as consul/guards.go does:
//
//	func txnGuard(key, session string) api.TxnOps {
//		return unless(mutant.On("consul/txn-check-session"), checkSession(key, session))
//	}
//
// (etcd/ keeps twins in guards_mutants.go, built with the tag
// holdfast_mutants.) In a normal build On is a constant false and the
// compiler drops the test. Built with the tag holdfast_mutants, On(name) is
// true for the one guard named by the environment variable HOLDFAST_MUTANT.
// docs/GUARDS.md lists the guards.
package mutant

// On reports whether the guard called name is removed in this build: never,
// in a normal build.
func On(name string) bool { return false }
