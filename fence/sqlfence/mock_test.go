package sqlfence_test

import (
	"database/sql"
	"errors"
)

// The examples (example_test.go) need a PostgreSQL server, which the
// library's module does not bring (it would land in every user's module
// graph). Here each example runs its mock, which prints the output the
// example prints against a real server; tests/fence/sqlfence runs the same
// file (a symbolic link to it) with the real body against a real server, the
// way etcd's client/v3 examples run in etcd's tests module.
func forUnitTestsRunInMockedContext(mock, _ func()) { mock() }

// exampleDB is the examples' database; with no server here it is never opened.
func exampleDB() (*sql.DB, error) {
	return nil, errors.New("no database server in the library's tests")
}
