package consul

// testHookTryRead and testHookLeaveRead, set by testhooks_test.go, run after
// TryLock's read, and after a release's read, before the write.
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
