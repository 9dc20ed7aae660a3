package etcd_test

// The examples (example_test.go) need an etcd server, which the library's
// module does not bring (it would land in every user's module graph). Here
// each example runs its mock, which prints the output the example prints
// against a real server; tests/etcd runs the same file (a symbolic link to
// it) with the real body against an embedded etcd, the way etcd's client/v3
// examples run in etcd's tests module.
func forUnitTestsRunInMockedContext(mock, _ func()) { mock() }

// endpoints are the etcd endpoints the examples' bodies dial, as yours
// would; tests/etcd points them at a server it starts for each example.
var endpoints = []string{"127.0.0.1:2379"}
