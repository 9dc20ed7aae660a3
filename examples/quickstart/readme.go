package main

// The README's other Go snippets, compiled here and checked against the
// README by TestReadmeShowsThisCode; TestRun runs those that need only etcd.

import (
	"context"
	"database/sql"
	"os"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/consul"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/fence/sqlfence"
	"github.com/holdfast/holdfast/semaphore"
	"github.com/holdfast/holdfast/shard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// README: semaphore
// encodeAll encodes every file, at most 4 at once across the fleet (the
// semaphore's limit) and 2 at once in this process. A session holds one
// permit at a time, so each concurrent holder has a session of its own;
// semaphore.Group hands the lockers out.
func encodeAll(ctx context.Context, endpoints []string, files []string, encode func(ctx context.Context, file string) error) error {
	lockers := make([]holdfast.Locker, 2)
	for i := range lockers {
		s, err := etcd.Dial(ctx, endpoints) // one lease per concurrent holder
		if err != nil {
			return err
		}
		defer s.Close()
		sem, err := etcd.NewSemaphore(s, "jobs/encoders", 4) // at most 4 holders, FIFO
		if err != nil {
			return err
		}
		lockers[i] = holdfast.AsLocker(sem)
	}
	g, err := semaphore.NewGroup(ctx, lockers...)
	if err != nil {
		return err
	}
	for _, file := range files {
		g.Go(func(ctx context.Context) error { // ctx ends if the permit is lost
			return encode(ctx, file) // semaphore.Permit(ctx).Token() fences its writes
		})
	}
	return g.Wait()
}

// README: rwmutex
// updateRoutes rewrites the routes, then keeps reading them with no writer
// in between.
func updateRoutes(ctx context.Context, s *etcd.Session, write, read func(ctx context.Context, token holdfast.Token) error) error {
	rw, err := etcd.NewRWMutex(s, "config/routes") // readers share, a writer excludes all, FIFO
	if err != nil {
		return err
	}
	w, err := rw.Lock(ctx)
	if err != nil {
		return err
	}
	if err := write(w.Context(), w.Token()); err != nil {
		_ = w.Unlock(ctx)
		return err
	}
	r, err := rw.Downgrade(ctx, w) // to a read grant, with no writer in between
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = r.Unlock(ctx)
	}()
	return read(r.Context(), r.Token())
}

// README: election
// lead campaigns until elected, then runs work while leader: work's context
// ends if the leadership is lost, and the term fences its writes.
func lead(ctx context.Context, s *etcd.Session, work func(ctx context.Context, term holdfast.Token) error) error {
	e, err := etcd.NewElection(s, "services/scheduler")
	if err != nil {
		return err
	}
	g, err := e.Campaign(ctx, []byte("node-7")) // blocks until leader
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = g.Unlock(ctx) // resigns
	}()
	return work(g.Context(), g.Token())
}

// README: sqlfence
// credit adds 100 to account 1 only if token is the highest that the
// database has seen for jobs/ledger; else the error wraps
// holdfast.ErrStaleToken and nothing is written.
func credit(ctx context.Context, db *sql.DB, token holdfast.Token) error {
	f, err := sqlfence.New(db) // database/sql, e.g. the pgx driver
	if err != nil {
		return err
	}
	if err := f.Init(ctx); err != nil { // CREATE TABLE IF NOT EXISTS holdfast_fence (resource, token, ...)
		return err
	}
	return f.Tx(ctx, "jobs/ledger", token, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = 1`, 100)
		return err
	})
}

// README: etcd TLS
func dialSecuredEtcd(ctx context.Context) (*etcd.Session, error) {
	return etcd.Dial(ctx, []string{"https://10.0.0.5:2379"},
		etcd.WithTLSFiles("/etc/etcd/ca.pem", "/etc/holdfast/client.pem", "/etc/holdfast/client-key.pem"), // or WithTLS(*tls.Config)
		etcd.WithCredentials("locker", os.Getenv("ETCDCTL_PASSWORD")),
	)
}

// README: consul TLS
func dialSecuredConsul(ctx context.Context, token string) (*consul.Session, error) {
	return consul.Dial(ctx, "https://127.0.0.1:8501",
		consul.WithToken(token),                           // else $CONSUL_HTTP_TOKEN / $CONSUL_HTTP_TOKEN_FILE
		consul.WithTLSFiles("/etc/consul/ca.pem", "", ""), // or WithTLS(*tls.Config); else $CONSUL_CACERT...
	)
}

// README: shard
// runTenants works on the shards of "tenants" that this process owns, until
// ctx ends; members share the 64 shards, one owner per shard at a time.
func runTenants(ctx context.Context, cli *clientv3.Client) error {
	s, err := etcd.NewSession(ctx, cli) // or consul.NewSession, then shard.Consul(s)
	if err != nil {
		return err
	}
	defer s.Close()
	g, err := shard.New(shard.Etcd(s), "tenants", shard.Config{Shards: 64})
	if err != nil {
		return err
	}
	return g.Run(ctx, func(ctx context.Context, sh shard.Shard, grant *etcd.Grant) {
		// work on shard sh.Index until ctx ends (the shard moves, is lost, or
		// Run's ctx ends); write with grant.Txn, or pass grant.Token() along
	})
}

// README: end

// Compiled only (run by their packages' tests): they need a PostgreSQL or a
// secured cluster, or run until cancelled (runTenants: tests/shard).
var _ = []any{credit, dialSecuredEtcd, dialSecuredConsul, runTenants}
