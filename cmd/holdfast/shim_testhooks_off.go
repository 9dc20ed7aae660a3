//go:build !holdfast_testhooks

package main

// shimPause does nothing outside test builds (see shim_testhooks.go).
func shimPause() {}
