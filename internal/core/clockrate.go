//go:build !holdfast_mutants

package core

import "time"

// clientTime is how long a duration d, counted on this process's monotonic
// clock, lasts in real time: d itself. (The build with the tag
// holdfast_mutants can make this clock run slow, for the safety suite: see
// clockrate_mutants.go. A normal build pays nothing for it.)
func clientTime(d time.Duration) time.Duration { return d }
