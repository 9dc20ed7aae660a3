//go:build !holdfast_mutants

// Package mutant removes one safety guard at a time, for `make mutants`: the
// check that the test suite notices when a guard is gone. The backends keep
// their guards as small functions in guards.go (etcd/, consul/), which a
// normal build uses, each with a twin in guards_mutants.go, built with the
// tag holdfast_mutants, that drops the guard when On names it:
//
//	func releaseGuard(key, session string) api.TxnOps {
//		if mutant.On("consul/release-check-session") {
//			return nil
//		}
//		return api.TxnOps{checkSession(key, session)}
//	}
//
// internal/core and cmd/holdfast test On inline, as in
// if !mutant.On("core/sync-deadline") { ...the guard... }: in a normal build
// On is a constant false and the compiler drops the test. Built with the tag
// holdfast_mutants, On(name) is true for the one guard named by the
// environment variable HOLDFAST_MUTANT. docs/GUARDS.md lists the guards.
package mutant

// On reports whether the guard called name is removed in this build: never,
// in a normal build.
func On(name string) bool { return false }
