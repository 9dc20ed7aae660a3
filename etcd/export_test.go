package etcd

// Test hooks.

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
