package holdfast

import "time"

// Observer receives the events of a session and of its grants, for metrics
// and logs: package metrics provides one for Prometheus, and the backends'
// WithLogger option one for log/slog. Give it to a session with the
// backend's WithObserver option.
//
// The methods are called synchronously from holdfast's goroutines, often
// with the grant's or the session's work waiting on them: they must be safe
// for concurrent use and return quickly, without blocking on I/O.
type Observer interface {
	// Waiting reports that an acquisition of name (Lock, TryLock, RLock,
	// Campaign...) began (delta +1) or ended (delta -1), granted or not.
	Waiting(name string, delta int)
	// Acquired reports a grant of name with token, after waiting wait
	// since the acquisition began.
	Acquired(name string, token Token, wait time.Duration)
	// Ended reports the end of a grant of name after it was held for held:
	// cause wraps ErrReleased after Unlock (or a Downgrade) and after the
	// session's Close (then it wraps ErrSessionClosed too), else it is why
	// the grant was lost (wrapping ErrLost or ErrSessionLost).
	Ended(name string, token Token, held time.Duration, cause error)
	// RenewalFailed reports a failed renewal of the session (a keepalive
	// or a session renew); the session retries until its safe deadline.
	RenewalFailed(err error)
	// SessionEnded reports the end of the session, once, with its cause
	// (ErrSessionClosed after Close, else an error wrapping ErrSessionLost).
	SessionEnded(cause error)
}
