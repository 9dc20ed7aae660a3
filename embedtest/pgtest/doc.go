// Package pgtest starts a throwaway PostgreSQL server for tests and
// examples: a fresh cluster in a temporary directory, from the server
// programs of a local installation (Debian's postgresql package, or $PG_BIN).
//
// It is a module of its own (github.com/holdfast/holdfast/embedtest/pgtest)
// because it brings the pgx driver: a module that imports it gets pgx, a
// module that imports only the library or embedtest does not.
package pgtest
