// Command postgres-fenced shows fencing against a real database: workers
// under one holdfast lock update a PostgreSQL table, each write guarded by
// sqlfence in the same transaction, and a holder that pauses past its
// lock's TTL has its late write refused by PostgreSQL itself.
//
// worker-1 takes the lock and credits an account. Then it stalls, as in a
// long GC pause: its connection to etcd is frozen by a loopback proxy, so its
// keepalives stop too, and its lease expires on the server. worker-2 gets
// the lock with a higher token and credits the account. When worker-1 wakes
// and sends its next write with its old token, the database refuses it: the
// fence table has already admitted worker-2's higher token.
//
// It starts an embedded etcd and a throwaway PostgreSQL server (Debian's
// postgresql package; see pgtest.PostgresBinDir), and removes both at
// the end.
//
//	go run ./examples/postgres-fenced
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/embedtest/pgtest"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/fence/sqlfence"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "postgres-fenced:", err)
		os.Exit(1)
	}
}

// lockName is the lock the workers share, and the fence's resource name.
const lockName = "jobs/ledger"

// credit adds amount to account 1 in a transaction that commits only if
// token is admitted by the fence.
func credit(ctx context.Context, f *sqlfence.Fence, token holdfast.Token, amount int) error {
	return f.Tx(ctx, lockName, token, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = 1`, amount)
		return err
	})
}

func run(ctx context.Context, stdout io.Writer, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("no arguments expected, got %q", args)
	}
	cluster, err := etcdtest.StartEtcd("", 1)
	if err != nil {
		return err
	}
	defer cluster.Close()
	pg, err := pgtest.StartPostgres()
	if err != nil {
		return err
	}
	defer pg.Close()
	fmt.Fprintf(stdout, "embedded etcd at %s, PostgreSQL on 127.0.0.1:%d (both temporary)\n", cluster.Endpoints()[0], pg.Port)

	db, err := pg.Open()
	if err != nil {
		return err
	}
	defer db.Close()
	fence, err := sqlfence.New(db)
	if err != nil {
		return err
	}
	if err := fence.Init(ctx); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL); INSERT INTO accounts VALUES (1, 0)`); err != nil {
		return err
	}

	// worker-1 reaches etcd through a proxy that can freeze its traffic.
	u, err := url.Parse(cluster.Endpoints()[0])
	if err != nil {
		return err
	}
	proxy, err := embedtest.NewProxy(u.Host)
	if err != nil {
		return err
	}
	defer proxy.Close()
	var mutexes [2]*etcd.Mutex
	for i, ep := range []string{proxy.URL(), cluster.Endpoints()[0]} {
		s, err := etcd.Dial(ctx, []string{ep}, etcd.WithTTL(etcd.MinTTL))
		if err != nil {
			return err
		}
		defer s.Close()
		if mutexes[i], err = etcd.NewMutex(s, lockName); err != nil {
			return err
		}
	}

	start := time.Now()
	log := func(who, format string, a ...any) {
		fmt.Fprintf(stdout, "%5d ms  %-8s  %s\n", time.Since(start).Milliseconds(), who, fmt.Sprintf(format, a...))
	}
	g1, err := mutexes[0].Lock(ctx)
	if err != nil {
		return err
	}
	log("worker-1", "holds the lock (token %d)", g1.Token())
	if err := credit(ctx, fence, g1.Token(), 100); err != nil {
		return err
	}
	log("postgres", "committed +100 from worker-1 (token %d)", g1.Token())

	// worker-1 stalls; its traffic to etcd freezes with it.
	proxy.Pause()
	log("worker-1", "PAUSES (its keepalives to etcd stop), about to credit +1000")
	told := make(chan time.Duration, 1)
	context.AfterFunc(g1.Context(), func() { told <- time.Since(start) })

	g2, err := mutexes[1].Lock(ctx)
	if err != nil {
		return err
	}
	defer g2.Unlock(context.WithoutCancel(ctx))
	log("worker-2", "holds the lock (token %d) after worker-1's lease expired", g2.Token())
	if err := credit(ctx, fence, g2.Token(), 10); err != nil {
		return err
	}
	log("postgres", "committed +10 from worker-2 (token %d)", g2.Token())

	// worker-1 wakes and goes on with what it was doing, with its old token.
	select {
	case at := <-told:
		fmt.Fprintf(stdout, "%5d ms  worker-1  had been told it lost the lock: %v\n", at.Milliseconds(), context.Cause(g1.Context()))
	default:
		log("worker-1", "was NOT told it lost the lock")
	}
	refused := 0
	err = credit(ctx, fence, g1.Token(), 1000)
	switch {
	case errors.Is(err, holdfast.ErrStaleToken):
		refused++
		log("postgres", "REFUSED worker-1's late +1000: %v", err)
	case err != nil:
		return err
	default:
		log("postgres", "ACCEPTED worker-1's late +1000: fencing failed")
	}
	proxy.Mend()

	var balance int64
	if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = 1`).Scan(&balance); err != nil {
		return err
	}
	highest, err := fence.Highest(ctx, lockName)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "balance %d (highest token admitted %d); late writes refused: %d\n", balance, highest, refused)
	if refused != 1 || balance != 110 || highest != g2.Token() {
		return errors.New("the late write was not refused")
	}
	return nil
}
