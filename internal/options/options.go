// Package options holds the configuration that holdfast.LockOption values
// set. It lives apart from the root package so that the root package shows
// only the contract, and apart from internal/core so that the root package
// can refer to it without an import cycle.
package options

// Lock is what a list of holdfast.LockOption produces.
type Lock struct {
	// Reentrant: see holdfast.WithReentrant.
	Reentrant bool
}

// ApplyLock applies opts to the defaults (see Apply).
func ApplyLock[O ~func(*Lock)](opts []O) Lock {
	var c Lock
	Apply(&c, opts)
	return c
}

// Apply applies opts, in order, to c (nil options are skipped): the lock
// options, and the backends' session options.
func Apply[C any, O ~func(*C)](c *C, opts []O) {
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
}
