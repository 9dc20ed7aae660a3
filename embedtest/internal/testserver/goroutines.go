package testserver

import (
	"runtime"
	"time"
)

// StableGoroutines waits (at most 5 s) until the goroutine count has not
// changed for 300 ms and returns it.
func StableGoroutines() int {
	deadline := time.Now().Add(5 * time.Second)
	n, since := runtime.NumGoroutine(), time.Now()
	for time.Since(since) < 300*time.Millisecond && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if m := runtime.NumGoroutine(); m != n {
			n, since = m, time.Now()
		}
	}
	return n
}

// SettledGoroutines waits (at most 5 s) for the goroutine count to drop to
// target and returns the count.
func SettledGoroutines(target int) int {
	deadline := time.Now().Add(5 * time.Second)
	n := runtime.NumGoroutine()
	for n > target && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
}
