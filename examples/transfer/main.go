// Command transfer moves money between accounts under a two-name lock.
//
// Each account's balance is a key in etcd ("bank/balances/<account>"), and
// each account has a lock of its own ("bank/accounts/<account>"). Workers
// (goroutines here, each with its own etcd client and session, as separate
// processes would have) pick two accounts at random, in random order, and
// lock both as one grant (etcd.NewMultiMutex): the names are always taken in
// sorted order, so two transfers A->B and B->A never deadlock. The worker
// reads both balances, and writes both new balances in one guarded
// transaction (MultiGrant.Txn), which commits only while both locks are
// still held. At the end the total is what it was: no transfer was lost or
// applied twice, and no balance went negative.
//
//	go run ./examples/transfer                  # starts an embedded etcd
//	go run ./examples/transfer -endpoints 127.0.0.1:2379 -transfers 200 -v
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
)

const (
	lockPrefix    = "bank/accounts/"
	balancePrefix = "bank/balances/"
	initial       = 100
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "transfer:", err)
		os.Exit(1)
	}
}

// bank is what the workers share.
type bank struct {
	accounts  []string
	transfers int // per worker
	verbose   bool
	out       *log.Logger
	done      atomic.Int64
}

func run(ctx context.Context, stdout io.Writer, args []string) error {
	b := &bank{out: log.New(stdout, "", 0)}
	fs := flag.NewFlagSet("transfer", flag.ContinueOnError)
	endpoints := fs.String("endpoints", "", "etcd endpoints, comma-separated (default: start an embedded etcd)")
	workers := fs.Int("workers", 4, "number of workers")
	accounts := fs.Int("accounts", 5, "number of accounts")
	fs.IntVar(&b.transfers, "transfers", 25, "transfers per worker")
	fs.BoolVar(&b.verbose, "v", false, "print every transfer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *workers < 1 || *accounts < 2 || b.transfers < 0 {
		return errors.New("want -workers >= 1, -accounts >= 2, -transfers >= 0")
	}
	for i := range *accounts {
		b.accounts = append(b.accounts, fmt.Sprintf("acct-%d", i))
	}
	eps := strings.Split(*endpoints, ",")
	if *endpoints == "" {
		cluster, err := etcdtest.StartEtcd("", 1) // in a temporary directory, removed by Close
		if err != nil {
			return err
		}
		defer cluster.Close()
		eps = cluster.Endpoints()
		b.out.Printf("no -endpoints: started an embedded etcd at %s (temporary directory)", eps[0])
	}
	cli, err := newClient(eps)
	if err != nil {
		return err
	}
	defer cli.Close()
	// Open the accounts (an existing balance is kept: runs add up).
	for _, a := range b.accounts {
		if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(balancePrefix+a), "=", 0)).
			Then(clientv3.OpPut(balancePrefix+a, strconv.Itoa(initial))).Commit(); err != nil {
			return err
		}
	}
	before, err := b.total(ctx, cli)
	if err != nil {
		return err
	}
	errs := make([]error, *workers)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = b.worker(ctx, fmt.Sprintf("worker-%d", i+1), eps) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	after, err := b.total(ctx, cli)
	if err != nil {
		return err
	}
	b.out.Printf("transfers=%d total before=%d after=%d", b.done.Load(), before, after)
	if after != before {
		return fmt.Errorf("the total changed from %d to %d", before, after)
	}
	return nil
}

func newClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// total sums the balances, failing on a negative one.
func (b *bank) total(ctx context.Context, cli *clientv3.Client) (int, error) {
	resp, err := cli.Get(ctx, balancePrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	sum := 0
	for _, kv := range resp.Kvs {
		v, err := strconv.Atoi(string(kv.Value))
		if err != nil || v < 0 {
			return 0, fmt.Errorf("balance %s = %q", kv.Key, kv.Value)
		}
		sum += v
	}
	return sum, nil
}

func (b *bank) worker(ctx context.Context, name string, endpoints []string) error {
	cli, err := newClient(endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second) // an unreachable etcd: fail, don't hang
	defer cancel()
	s, err := etcd.NewSession(sctx, cli)
	if err != nil {
		return err
	}
	defer s.Close()
	for range b.transfers {
		i := rand.IntN(len(b.accounts))
		j := (i + 1 + rand.IntN(len(b.accounts)-1)) % len(b.accounts)
		if err := b.transfer(ctx, s, name, b.accounts[i], b.accounts[j], 1+rand.IntN(30)); err != nil {
			return err
		}
	}
	return nil
}

// transfer moves up to amount from one account to another (what the
// sender has, if less).
func (b *bank) transfer(ctx context.Context, s *etcd.Session, worker, from, to string, amount int) error {
	// Both accounts as one lock, whatever the order: taken sorted.
	m, err := etcd.NewMultiMutex(s, lockPrefix+from, lockPrefix+to)
	if err != nil {
		return err
	}
	g, err := m.Lock(ctx)
	if err != nil {
		return err
	}
	defer g.Unlock(context.WithoutCancel(ctx))

	resp, err := s.Client().Txn(ctx).Then(clientv3.OpGet(balancePrefix+from), clientv3.OpGet(balancePrefix+to)).Commit()
	if err != nil {
		return err
	}
	fb, _ := strconv.Atoi(string(resp.Responses[0].GetResponseRange().Kvs[0].Value))
	tb, _ := strconv.Atoi(string(resp.Responses[1].GetResponseRange().Kvs[0].Value))
	amount = min(amount, fb)
	// One guarded write: it commits only while both locks are held (each
	// key's create revision is compared in the same transaction).
	if _, err := g.Txn(ctx,
		clientv3.OpPut(balancePrefix+from, strconv.Itoa(fb-amount)),
		clientv3.OpPut(balancePrefix+to, strconv.Itoa(tb+amount))); err != nil {
		return fmt.Errorf("%s: transfer %s->%s: %w", worker, from, to, err)
	}
	b.done.Add(1)
	if b.verbose {
		b.out.Printf("%s: %s -> %s: %d (tokens %d, %d)", worker, from, to, amount, g.Token(lockPrefix+from), g.Token(lockPrefix+to))
	}
	return nil
}
