//go:build holdfast_testhooks || holdfast_mutants

package consul

// Test hooks, in the builds with the tag holdfast_testhooks (the test
// command's) or holdfast_mutants (scripts/mutants.sh: the guards' tests use
// them); a user's build has the empty ones of testhooks_off.go. The tests
// that set them are in testhooks_test.go.

// testHookTryRead and testHookLeaveRead, if set, run after TryLock's read,
// and after a release's read, before the write.
var testHookTryRead, testHookLeaveRead func(p *permits)

func hookTryRead(p *permits) {
	if testHookTryRead != nil {
		testHookTryRead(p)
	}
}

func hookLeaveRead(p *permits) {
	if testHookLeaveRead != nil {
		testHookLeaveRead(p)
	}
}
