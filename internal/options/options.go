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

// ApplyLock applies opts, in order, to the defaults (nil options are
// skipped).
func ApplyLock[O ~func(*Lock)](opts []O) Lock {
	var c Lock
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}
