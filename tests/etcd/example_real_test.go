package etcd_test

import (
	"log"
	"os"
	"testing"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// example_test.go is a link to etcd/example_test.go: one source of each
// example. There its mock runs; here its body runs against an embedded etcd
// started for it (endpoints point at it), and go test checks its Output.
func forUnitTestsRunInMockedContext(_, example func()) {
	c, err := etcdtest.StartEtcd("", 1)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	endpoints = c.Endpoints()
	example()
}

// endpoints are the etcd endpoints the examples' bodies dial, as yours
// would: the server forUnitTestsRunInMockedContext started.
var endpoints []string

// TestExamplesAreTheLibrarys: example_test.go stays a link to the library
// package's file, never a copy that could drift from it.
func TestExamplesAreTheLibrarys(t *testing.T) {
	if target, err := os.Readlink("example_test.go"); err != nil || target != "../../etcd/example_test.go" {
		t.Fatalf("example_test.go must be a symbolic link to ../../etcd/example_test.go (etcd's examples): %q, %v", target, err)
	}
}
