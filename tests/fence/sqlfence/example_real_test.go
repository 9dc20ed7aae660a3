package sqlfence_test

import (
	"database/sql"
	"os"
	"testing"
)

// example_test.go is a link to fence/sqlfence/example_test.go: one source of
// each example. There its mock runs; here its body runs against the
// package's PostgreSQL server (TestMain), and go test checks its Output.
func forUnitTestsRunInMockedContext(_, example func()) { example() }

func exampleDB() (*sql.DB, error) { return pg.Open() }

// TestExamplesAreTheLibrarys: example_test.go stays a link to the library
// package's file, never a copy that could drift from it.
func TestExamplesAreTheLibrarys(t *testing.T) {
	if target, err := os.Readlink("example_test.go"); err != nil || target != "../../../fence/sqlfence/example_test.go" {
		t.Fatalf("example_test.go must be a symbolic link to ../../../fence/sqlfence/example_test.go (fence/sqlfence's examples): %q, %v", target, err)
	}
}
