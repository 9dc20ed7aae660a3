//go:build holdfast_testhooks

// Test hooks for the tests against a real server, which live in the tests
// module (tests/etcd) and so cannot use an export_test.go: that module's
// Makefile, CI and scripts/mutants.sh build with -tags holdfast_testhooks,
// and tests/etcd refuses to run without it (testhooks_off_test.go). A
// build without the tag, as every user's, has none of them.

package etcd

// WatchCreates returns how many watch creations s's watcher has queued and
// how many the server confirmed.
func WatchCreates(s *Session) (queued, confirmed int64) {
	return s.watcher.creates.Load(), s.watcher.created.Load()
}

// BreakWatch cuts s's current watch stream, so that the watcher reconnects
// and creates every watch again.
func BreakWatch(s *Session) {
	s.watcher.mu.Lock()
	cancel := s.watcher.cancel
	s.watcher.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// ObserveFromOnce makes the next watch of an Observe start from revision
// from (a compacted one, say), and the later ones as usual. It returns a
// function that reports whether the hook was used. Call it before the
// Observe (the hook stays, delegating to the usual behaviour once used, so
// that no running Observe races with a restore).
func ObserveFromOnce(from int64) (restore func() bool) {
	orig := observeFrom
	used := make(chan struct{}, 1)
	observeFrom = func(rev int64) int64 {
		select {
		case used <- struct{}{}:
			return from
		default:
			return orig(rev)
		}
	}
	return func() bool { return len(used) == 1 }
}
