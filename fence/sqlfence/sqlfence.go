// Package sqlfence fences writes to a SQL database with holdfast's fencing
// tokens: a write commits only if its token is at least the highest token
// the database has already admitted for the same resource, checked in the
// same transaction as the write. A holder that lost its lock without knowing
// it (a long pause, a partition) and writes late with its old token is
// refused by the database itself, whatever its own clock or grant context
// say.
//
// Two styles, both tested against PostgreSQL (driver
// github.com/jackc/pgx/v5/stdlib):
//
//   - A fence table (Fence): one row per protected resource holding the
//     highest token admitted. Fence.Tx runs your writes in a transaction
//     that first raises the resource's token, atomically with the check;
//     Fence.Admit does the same inside a transaction of yours. Nothing about
//     your own tables changes.
//   - A token column on each protected row: make the condition part of the
//     write, and check that a row was affected with CheckRows (see below).
//
// The token-column style:
//
//	res, err := db.ExecContext(ctx,
//		`UPDATE accounts SET balance = $1, fence_token = $2
//		 WHERE id = $3 AND fence_token <= $2`, balance, int64(g.Token()), id)
//	if err := sqlfence.CheckRows(res, err); err != nil {
//		// errors.Is(err, holdfast.ErrStaleToken): a newer holder wrote first
//	}
//
// A refused write returns an error wrapping holdfast.ErrStaleToken. Tokens
// are compared per resource, so use one resource name per lock (the lock's
// name is a good choice): tokens of different locks are unrelated.
//
// The SQL is PostgreSQL's (INSERT ... ON CONFLICT ... DO UPDATE ... WHERE,
// RETURNING, $n placeholders). Under PostgreSQL's default READ COMMITTED
// isolation, two transactions admitting the same resource serialise on its
// row: a newer token waits for an older one's transaction to end, and an
// older token that comes after a newer one's commit is refused.
package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"regexp"

	"github.com/holdfast/holdfast"
)

// DefaultTable is the fence table's name when WithTable is not given.
const DefaultTable = "holdfast_fence"

// Fence admits tokens per resource, keeping the highest one admitted in a
// table of the database (see Init for its schema). It is safe for
// concurrent use.
type Fence struct {
	db     *sql.DB
	table  string
	admit  string
	lookup string
}

// Option configures New.
type Option func(*Fence)

// WithTable sets the fence table's name (default DefaultTable): an SQL
// identifier, optionally qualified by a schema ("ops.fence"), letters,
// digits and underscores only.
func WithTable(name string) Option { return func(f *Fence) { f.table = name } }

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// New returns a Fence over db. It sends nothing to the database: call Init
// once (or create the table yourself) before the first write.
func New(db *sql.DB, opts ...Option) (*Fence, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sqlfence: nil *sql.DB", holdfast.ErrInvalidArgument)
	}
	f := &Fence{db: db, table: DefaultTable}
	for _, o := range opts {
		if o != nil {
			o(f)
		}
	}
	if !identifier.MatchString(f.table) {
		return nil, fmt.Errorf("%w: sqlfence: table name %q is not a plain SQL identifier", holdfast.ErrInvalidArgument, f.table)
	}
	f.admit = `INSERT INTO ` + f.table + ` AS f (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
WHERE f.token <= EXCLUDED.token
RETURNING token`
	f.lookup = `SELECT token FROM ` + f.table + ` WHERE resource = $1`
	return f, nil
}

// Table returns the fence table's name.
func (f *Fence) Table() string { return f.table }

// Init creates the fence table if it does not exist:
//
//	CREATE TABLE IF NOT EXISTS holdfast_fence (
//	    resource   text PRIMARY KEY,
//	    token      bigint NOT NULL CHECK (token >= 0),
//	    updated_at timestamptz NOT NULL DEFAULT now()
//	)
func (f *Fence) Init(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: sqlfence: nil context", holdfast.ErrInvalidArgument)
	}
	_, err := f.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+f.table+` (
    resource   text PRIMARY KEY,
    token      bigint NOT NULL CHECK (token >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
)`)
	if err != nil {
		return fmt.Errorf("sqlfence: create table %s: %w", f.table, err)
	}
	return nil
}

// Tx runs fn in a transaction that commits only if token is admitted for
// resource: at least the highest token admitted for it so far. The token
// is raised first, in the same transaction, so from its commit on no lower
// token is admitted for resource. If token is stale, fn is not called,
// nothing is written, and the error wraps holdfast.ErrStaleToken. If fn
// returns an error, the transaction (the token's raise included) is rolled
// back and Tx returns that error.
//
// ctx bounds the whole transaction: if it ends, the database rolls back.
func (f *Fence) Tx(ctx context.Context, resource string, token holdfast.Token, fn func(*sql.Tx) error) error {
	if err := check(ctx, resource, token); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: sqlfence: nil function", holdfast.ErrInvalidArgument)
	}
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlfence: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := f.Admit(ctx, tx, resource, token); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlfence: commit: %w", err)
	}
	return nil
}

// Admit raises resource's token to token within tx, or returns an error
// wrapping holdfast.ErrStaleToken if a higher token was admitted before
// (then roll tx back: write nothing). Use it at the start of a transaction
// of your own; the admission counts only if tx commits.
func (f *Fence) Admit(ctx context.Context, tx *sql.Tx, resource string, token holdfast.Token) error {
	if err := check(ctx, resource, token); err != nil {
		return err
	}
	if tx == nil {
		return fmt.Errorf("%w: sqlfence: nil *sql.Tx", holdfast.ErrInvalidArgument)
	}
	var got int64
	err := tx.QueryRowContext(ctx, f.admit, resource, int64(token)).Scan(&got)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		var highest int64
		if err := tx.QueryRowContext(ctx, f.lookup, resource).Scan(&highest); err != nil {
			return fmt.Errorf("%w: %s refused token %d", holdfast.ErrStaleToken, resource, token)
		}
		return fmt.Errorf("%w: %s has admitted token %d, this write carries %d", holdfast.ErrStaleToken, resource, highest, token)
	case err != nil:
		return fmt.Errorf("sqlfence: admit token %d for %s: %w", token, resource, err)
	}
	return nil
}

// Highest returns the highest token admitted for resource, or 0 if none.
func (f *Fence) Highest(ctx context.Context, resource string) (holdfast.Token, error) {
	if err := check(ctx, resource, 0); err != nil {
		return 0, err
	}
	var t int64
	err := f.db.QueryRowContext(ctx, f.lookup, resource).Scan(&t)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("sqlfence: read the token of %s: %w", resource, err)
	}
	return holdfast.Token(t), nil
}

// CheckRows is for the token-column style: given the result of a write
// whose WHERE clause holds the token condition ("... AND fence_token <=
// $n"), it returns err if not nil, an error wrapping holdfast.ErrStaleToken
// if no row was affected, and nil otherwise. A row that does not exist also
// affects no row: when that can happen, tell the two apart yourself.
func CheckRows(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlfence: rows affected: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: no row admitted the write's token", holdfast.ErrStaleToken)
	}
	return nil
}

func check(ctx context.Context, resource string, token holdfast.Token) error {
	switch {
	case ctx == nil:
		return fmt.Errorf("%w: sqlfence: nil context", holdfast.ErrInvalidArgument)
	case resource == "":
		return fmt.Errorf("%w: sqlfence: empty resource name", holdfast.ErrInvalidArgument)
	case uint64(token) > math.MaxInt64:
		return fmt.Errorf("%w: sqlfence: token %d does not fit a bigint", holdfast.ErrInvalidArgument, token)
	}
	return nil
}
