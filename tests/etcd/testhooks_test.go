//go:build holdfast_testhooks

package etcd_test

import "github.com/holdfast/holdfast/etcd"

// The package's test hooks (etcd/export_testhooks.go).
var (
	watchCreates    = etcd.WatchCreates
	breakWatch      = etcd.BreakWatch
	observeFromOnce = etcd.ObserveFromOnce
)
