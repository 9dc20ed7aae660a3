//go:build !holdfast_testhooks && !holdfast_mutants

package consul

// hookTryRead and hookLeaveRead do nothing in a build without test hooks
// (see testhooks.go).
func hookTryRead(*permits)   {}
func hookLeaveRead(*permits) {}
