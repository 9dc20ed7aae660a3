package etcd_test

import (
	"log"
	"os"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// example_test.go is a link to etcd/example_test.go: one source of each
// example. There its mock runs; here its body runs against an embedded etcd,
// and go test checks its Output.
func forUnitTestsRunInMockedContext(_, example func()) { example() }

// startEtcd starts a throwaway etcd for an example; in real code, connect
// clientv3 to your cluster instead.
func startEtcd() (endpoints []string, cli *clientv3.Client, stop func()) {
	c, err := etcdtest.StartEtcd("", 1)
	if err != nil {
		log.Fatal(err)
	}
	cli, err = c.NewClient()
	if err != nil {
		log.Fatal(err)
	}
	return c.Endpoints(), cli, func() { cli.Close(); c.Close() }
}

// TestExamplesAreTheLibrarys: example_test.go stays a link to the library
// package's file, never a copy that could drift from it.
func TestExamplesAreTheLibrarys(t *testing.T) {
	if target, err := os.Readlink("example_test.go"); err != nil || target != "../../etcd/example_test.go" {
		t.Fatalf("example_test.go must be a symbolic link to ../../etcd/example_test.go (etcd's examples): %q, %v", target, err)
	}
}
