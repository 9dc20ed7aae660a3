//go:build holdfast_testhooks

package main

import (
	"os"
	"time"
)

// shimPause, in a test build only, pauses the shim between its go and its
// exec for $HOLDFAST_TEST_SHIM_PAUSE (a duration), so that a test can act
// in that window.
func shimPause() {
	if d, err := time.ParseDuration(os.Getenv("HOLDFAST_TEST_SHIM_PAUSE")); err == nil {
		time.Sleep(d)
	}
}
