// Command shard-tenants shows per-tenant workers sharing tenants across a
// fleet with package shard: each tenant is a shard, owned by one worker at a
// time, and every row a worker writes for a tenant goes into PostgreSQL in
// a transaction fenced (fence/sqlfence) by that tenant's token.
//
// Three workers share 12 tenants (4 each); a fourth joins (3 each: about
// 12/4 tenants move), then the first leaves (4 each again). The program
// then checks, in the database, that each tenant's rows were written by one
// worker at a time: in insertion order, a tenant's tokens never go down, and
// a worker's run of rows for a tenant is never interleaved with another's.
//
// It starts an embedded etcd and a throwaway PostgreSQL server (Debian's
// postgresql package; see pgtest.PostgresBinDir), and removes both at
// the end.
//
//	go run ./examples/shard-tenants
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"time"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/embedtest/pgtest"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/fence/sqlfence"
	"github.com/holdfast/holdfast/shard"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "shard-tenants:", err)
		os.Exit(1)
	}
}

const (
	group   = "tenants"
	tenants = 12
)

// worker is one member of the group.
type worker struct {
	name   string
	g      *shard.Group[*etcd.Grant]
	cancel context.CancelFunc
	done   chan error
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
	if _, err := db.ExecContext(ctx, `CREATE TABLE events (id bigserial PRIMARY KEY, tenant int NOT NULL, worker text NOT NULL, token bigint NOT NULL)`); err != nil {
		return err
	}

	// work writes a row for its tenant every 10 ms, fenced by the tenant's
	// token, until its context ends (the tenant moves, or the worker
	// leaves).
	work := func(name string) func(ctx context.Context, s shard.Shard, g *etcd.Grant) {
		return func(ctx context.Context, s shard.Shard, g *etcd.Grant) {
			for ctx.Err() == nil {
				err := fence.Tx(ctx, fmt.Sprintf("%s/%d", group, s.Index), g.Token(), func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO events (tenant, worker, token) VALUES ($1, $2, $3)`, s.Index, name, int64(g.Token()))
					return err
				})
				if err != nil {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	var workers []*worker
	join := func() error {
		name := fmt.Sprintf("worker-%d", len(workers)+1)
		s, err := etcd.Dial(ctx, cluster.Endpoints(), etcd.WithTTL(etcd.MinTTL))
		if err != nil {
			return err
		}
		g, err := shard.New(shard.Etcd(s), group, shard.Config{Shards: tenants, Member: name})
		if err != nil {
			s.Close()
			return err
		}
		wctx, cancel := context.WithCancel(ctx)
		w := &worker{name: name, g: g, cancel: cancel, done: make(chan error, 1)}
		go func() {
			w.done <- g.Run(wctx, work(name))
			s.Close()
		}()
		workers = append(workers, w)
		return nil
	}
	defer func() {
		for _, w := range workers {
			w.cancel()
			<-w.done
			w.done <- nil
		}
	}()
	start := time.Now()
	// settle waits until every tenant is owned, by live workers in turn
	// owning floor or ceil of tenants/workers, and prints who owns how many.
	settle := func(what string, live []*worker) error {
		began := time.Now()
		for {
			var counts []int
			total := 0
			for _, w := range live {
				n := len(w.g.Owned())
				counts = append(counts, n)
				total += n
			}
			lo, hi := tenants/len(live), (tenants+len(live)-1)/len(live)
			if total == tenants && slices.Min(counts) >= lo && slices.Max(counts) <= hi {
				fmt.Fprintf(stdout, "%5d ms  %s: settled in %d ms, tenants per worker %v\n", time.Since(start).Milliseconds(), what, time.Since(began).Milliseconds(), counts)
				return nil
			}
			if time.Since(began) > 20*time.Second {
				return fmt.Errorf("%s: not balanced after 20 s: %v", what, counts)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	for range 3 {
		if err := join(); err != nil {
			return err
		}
	}
	if err := settle("3 workers start", workers); err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	if err := join(); err != nil {
		return err
	}
	if err := settle("worker-4 joins", workers); err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	workers[0].cancel()
	if err := <-workers[0].done; err != nil {
		return err
	}
	workers[0].done <- nil
	if err := settle("worker-1 leaves", workers[1:]); err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	for _, w := range workers {
		w.cancel()
	}

	// One writer per tenant at a time, as the database saw it.
	rows, err := db.QueryContext(context.WithoutCancel(ctx), `SELECT tenant, worker, token FROM events ORDER BY id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	type run struct {
		worker string
		token  int64
	}
	last := map[int]run{}
	seen := map[int]map[run]bool{}
	n, moves, bad := 0, 0, 0
	for rows.Next() {
		var t int
		var r run
		if err := rows.Scan(&t, &r.worker, &r.token); err != nil {
			return err
		}
		n++
		prev, ok := last[t]
		switch {
		case !ok:
			seen[t] = map[run]bool{}
		case r == prev:
			continue
		case r.token < prev.token || seen[t][r]:
			bad++ // an older owner wrote after a newer one, or came back
		default:
			moves++
		}
		seen[t][r] = true
		last[t] = r
	}
	if err := rows.Err(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d rows for %d tenants; a tenant changed writer %d times; rows out of turn: %d\n", n, len(last), moves, bad)
	if bad > 0 || len(last) != tenants {
		return errors.New("a tenant had two writers at once")
	}
	return nil
}
