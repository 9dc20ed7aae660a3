//go:build !holdfast_testhooks

package etcd

// observeFrom is the revision Observe's watch starts from after the
// revision rev was read or seen. (The build with the tag holdfast_testhooks
// lets tests replace it: see testhooks.go.)
func observeFrom(rev int64) int64 { return rev + 1 }
