package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest/pgtest"
	"github.com/holdfast/holdfast/fence/sqlfence"
)

var pg *pgtest.PostgresServer

// TestMain starts one PostgreSQL server for the package; each test uses
// tables and resources of its own.
func TestMain(m *testing.M) {
	var err error
	pg, err = pgtest.StartPostgres()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	pg.Close()
	os.Exit(code)
}

func setup(t *testing.T, table string) (*sql.DB, *sqlfence.Fence) {
	t.Helper()
	db, err := pg.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f, err := sqlfence.New(db, sqlfence.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Init(ctx); err != nil { // idempotent
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+table+`_data (k text PRIMARY KEY, v text NOT NULL, fence_token bigint NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	return db, f
}

func write(ctx context.Context, f *sqlfence.Fence, token holdfast.Token, table, value string) error {
	return f.Tx(ctx, "res", token, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO `+table+`_data (k, v) VALUES ('k', $1) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v`, value)
		return err
	})
}

func value(t *testing.T, db *sql.DB, table string) string {
	t.Helper()
	var v string
	if err := db.QueryRow(`SELECT v FROM ` + table + `_data WHERE k = 'k'`).Scan(&v); err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatal(err)
	}
	return v
}

// TestTxOrder: equal and higher tokens are admitted, a lower one is refused
// with ErrStaleToken and writes nothing; a failing function rolls back the
// token's raise too.
func TestTxOrder(t *testing.T) {
	db, f := setup(t, "fence_order")
	ctx := context.Background()
	for _, step := range []struct {
		token holdfast.Token
		value string
		stale bool
	}{{5, "a", false}, {5, "b", false}, {7, "c", false}, {6, "late", true}, {1, "older", true}, {8, "d", false}} {
		err := write(ctx, f, step.token, "fence_order", step.value)
		if step.stale != errors.Is(err, holdfast.ErrStaleToken) || (!step.stale && err != nil) {
			t.Fatalf("token %d: %v, want stale=%v", step.token, err, step.stale)
		}
	}
	if v := value(t, db, "fence_order"); v != "d" {
		t.Errorf("value %q, want d (stale writes applied?)", v)
	}
	if h, err := f.Highest(ctx, "res"); err != nil || h != 8 {
		t.Errorf("Highest = %d, %v; want 8", h, err)
	}
	boom := errors.New("boom")
	err := f.Tx(ctx, "res", 20, func(tx *sql.Tx) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Tx with a failing function: %v, want boom", err)
	}
	if h, _ := f.Highest(ctx, "res"); h != 8 {
		t.Errorf("after a rolled-back Tx the token is %d, want still 8", h)
	}
	if err := write(ctx, f, 9, "fence_order", "e"); err != nil {
		t.Errorf("token 9 after the rollback of 20: %v", err)
	}
	if h, _ := f.Highest(ctx, "unknown"); h != 0 {
		t.Errorf("Highest of an unknown resource = %d, want 0", h)
	}
}

// TestConcurrentHolders: an older holder's open transaction holds the
// resource's row; a newer token waits for it, and once the newer one has
// committed, the older token is refused.
func TestConcurrentHolders(t *testing.T) {
	db, f := setup(t, "fence_conc")
	ctx := context.Background()
	old, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Admit(ctx, old, "res", 5); err != nil {
		t.Fatal(err)
	}
	newDone := make(chan error, 1)
	go func() { newDone <- write(ctx, f, 7, "fence_conc", "new") }()
	select {
	case err := <-newDone:
		t.Fatalf("the newer token committed (%v) while the older transaction held the row", err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := old.ExecContext(ctx, `INSERT INTO fence_conc_data (k, v) VALUES ('k', 'old')`); err != nil {
		t.Fatal(err)
	}
	if err := old.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-newDone; err != nil {
		t.Fatalf("newer token after the older committed: %v", err)
	}
	if err := write(ctx, f, 5, "fence_conc", "stale"); !errors.Is(err, holdfast.ErrStaleToken) {
		t.Fatalf("older token after the newer committed: %v, want ErrStaleToken", err)
	}
	if v := value(t, db, "fence_conc"); v != "new" {
		t.Errorf("value %q, want new", v)
	}
}

// TestManyWriters: writers with random tokens race; the tokens admitted, in
// commit order, never decrease.
func TestManyWriters(t *testing.T) {
	db, f := setup(t, "fence_many")
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE fence_many_log (id bigserial PRIMARY KEY, token bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				tok := holdfast.Token(1 + (w*37+i*53)%100)
				err := f.Tx(ctx, "res", tok, func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO fence_many_log (token) VALUES ($1)`, int64(tok))
					return err
				})
				if err != nil && !errors.Is(err, holdfast.ErrStaleToken) {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	rows, err := db.Query(`SELECT token FROM fence_many_log ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var last, n int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			t.Fatal(err)
		}
		if tok < last {
			t.Fatalf("token %d committed after %d", tok, last)
		}
		last, n = tok, n+1
	}
	if n == 0 {
		t.Fatal("no write was admitted")
	}
	t.Logf("%d of 200 writes admitted, in token order", n)
}

// TestCheckRows: the token-column style.
func TestCheckRows(t *testing.T) {
	db, _ := setup(t, "fence_rows")
	ctx := context.Background()
	if _, err := db.Exec(`INSERT INTO fence_rows_data (k, v, fence_token) VALUES ('k', 'init', 0)`); err != nil {
		t.Fatal(err)
	}
	upd := func(tok int64, v string) error {
		return sqlfence.CheckRows(db.ExecContext(ctx, `UPDATE fence_rows_data SET v = $1, fence_token = $2 WHERE k = 'k' AND fence_token <= $2`, v, tok))
	}
	if err := upd(10, "ten"); err != nil {
		t.Fatal(err)
	}
	if err := upd(9, "nine"); !errors.Is(err, holdfast.ErrStaleToken) {
		t.Fatalf("older token: %v, want ErrStaleToken", err)
	}
	if v := value(t, db, "fence_rows"); v != "ten" {
		t.Errorf("value %q, want ten", v)
	}
	bad := errors.New("driver error")
	if err := sqlfence.CheckRows(nil, bad); err != bad {
		t.Errorf("CheckRows(nil, err) = %v, want err", err)
	}
}

// TestBadInput: clear errors, no request.
func TestBadInput(t *testing.T) {
	db, f := setup(t, "fence_bad")
	ctx := context.Background()
	for _, name := range []string{"", "a;drop table x", "1abc", "a.b.c", "a-b", `"q"`} {
		if _, err := sqlfence.New(db, sqlfence.WithTable(name)); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("table %q: %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := sqlfence.New(nil); !errors.Is(err, holdfast.ErrInvalidArgument) {
		t.Errorf("nil db: %v", err)
	}
	noop := func(*sql.Tx) error { return nil }
	//lint:ignore SA1012 a nil context is the bad input under test
	nilCtxErr := f.Tx(nil, "res", 1, noop)
	for _, err := range []error{
		nilCtxErr,
		f.Tx(ctx, "", 1, noop),
		f.Tx(ctx, "res", math.MaxInt64+1, noop),
		f.Tx(ctx, "res", 1, nil),
		f.Admit(ctx, nil, "res", 1),
	} {
		if !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("%v, want ErrInvalidArgument", err)
		}
	}
	if h, _ := f.Highest(ctx, "res"); h != 0 {
		t.Errorf("bad input wrote token %d", h)
	}
}
