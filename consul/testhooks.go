package consul

// hookTryRead and hookLeaveRead, replaced by testhooks_test.go, run after
// TryLock's read, and after a release's read, before the write.
var hookTryRead, hookLeaveRead = func(*permits) {}, func(*permits) {}
