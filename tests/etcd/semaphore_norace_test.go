//go:build !race

// The race detector slows 256 contenders (and the embedded server they
// share the process with) too much, so this file is left out of -race
// builds; `make test` runs it in its build without -race.

package etcd_test

import (
	"testing"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// Unary RPCs per acquisition stay flat (within 10%) from 2 to 256
// contenders of a semaphore of limit 4.
func TestSemaphoreRPCsFlat256(t *testing.T) {
	c := etcdtest.Etcd(t)
	figures := map[int]float64{}
	for _, n := range []int{2, 16, 64, 256} {
		figures[n] = rpcsPerAcquisition(t, c, n, max(2, 128/n))
	}
	flat(t, figures)
}

// Unary RPCs per acquisition of a Mutex stay flat (within 10%) from 2 to
// 512 contenders.
func TestLockRPCsFlat512(t *testing.T) {
	c := etcdtest.Etcd(t)
	figures := map[int]float64{}
	for _, n := range []int{2, 16, 128, 512} {
		figures[n] = lockRPCsPerAcquisition(t, c, n, max(2, 256/n))
	}
	flat(t, figures)
}
