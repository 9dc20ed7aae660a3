//go:build holdfast_testhooks

package etcd

// observeFrom is the revision Observe's watch starts from after the
// revision rev was read or seen; in this build (tag holdfast_testhooks)
// tests replace it (ObserveFromOnce in export_testhooks.go).
var observeFrom = func(rev int64) int64 { return rev + 1 }
