//go:build !holdfast_testhooks

package etcd_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/holdfast/holdfast/etcd"
)

// Without -tags holdfast_testhooks the package's test hooks
// (etcd/export_testhooks.go) do not exist. These stand-ins keep the tests
// compiling (go vet, gopls) and TestMain fails the run at once, so that no
// build without the tag passes by skipping the tests that need a hook.
func watchCreates(*etcd.Session) (queued, confirmed int64) { panic("needs -tags holdfast_testhooks") }
func breakWatch(*etcd.Session)                             { panic("needs -tags holdfast_testhooks") }
func observeFromOnce(int64) func() bool                    { panic("needs -tags holdfast_testhooks") }

func TestMain(m *testing.M) {
	fmt.Fprintln(os.Stderr, "tests/etcd: run with -tags holdfast_testhooks (etcd/export_testhooks.go; make test passes it)")
	os.Exit(1)
}
