//go:build !race

package etcd_test

const raceEnabled = false
