package etcd_test

import clientv3 "go.etcd.io/etcd/client/v3"

// The examples (example_test.go) need an etcd server, which the library's
// module does not bring (it would land in every user's module graph). Here
// each example runs its mock, which prints the output the example prints
// against a real server; tests/etcd runs the same file (a symbolic link to
// it) with the real body against an embedded etcd, the way etcd's client/v3
// examples run in etcd's tests module.
func forUnitTestsRunInMockedContext(mock, _ func()) { mock() }

// startEtcd is the examples' server; with no server here it is never called.
func startEtcd() (endpoints []string, cli *clientv3.Client, stop func()) {
	panic("no etcd server in the library's tests")
}
