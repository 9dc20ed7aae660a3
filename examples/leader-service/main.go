// Command leader-service runs a leader-elected service on etcd: three
// replicas campaign on one election with leader.Run; the leader does the
// service's writes, each a guarded write (Grant.Txn) that commits only
// while its leadership holds, stamped with its term. Mid-term, the leader
// is killed (its connection to etcd is cut, as a crash or a partition
// would, so its lease expires within the TTL; or, with -kill revoke, its
// lease is revoked): its leadership context is cancelled, another replica
// takes over with a higher term, and no write of the old leader lands
// after the new leader's.
//
//	go run ./examples/leader-service                  # starts an embedded etcd
//	go run ./examples/leader-service -endpoints 127.0.0.1:2379 -kills 3 -v
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/leader"
)

const (
	electionName = "services/billing/leader"
	// The service's record. Not under electionName+"/": every key there is
	// a candidate.
	recordKey = "services/billing/record"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "leader-service:", err)
		os.Exit(1)
	}
}

// replica is one instance of the service: its own client (through a
// proxy that can cut it off), session and election.
type replica struct {
	name  string
	proxy *embedtest.Proxy
	sess  *etcd.Session
	done  chan struct{} // closed when Run has returned
}

// service is what the replicas share (the output, the tally).
type service struct {
	out     io.Writer
	verbose bool
	every   time.Duration

	mu      sync.Mutex
	leading map[string]chan struct{} // closed when that replica's term started
	terms   []holdfast.Token
	writes  int
	refused int
	lastAt  time.Time // when the last leader's context ended, or the kill
}

func (s *service) printf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, format+"\n", args...)
}

func run(ctx context.Context, out io.Writer, args []string) error {
	fs := flag.NewFlagSet("leader-service", flag.ContinueOnError)
	fs.SetOutput(out)
	endpoints := fs.String("endpoints", "", "etcd endpoints, comma-separated (default: start an embedded etcd)")
	ttl := fs.Duration("ttl", 2*time.Second, "session TTL: how long a killed leader keeps its leadership in etcd at most")
	kills := fs.Int("kills", 2, "how many leaders to kill mid-term")
	kill := fs.String("kill", "cut", "how to kill the leader: cut (its connection, so that its lease expires) or revoke (its lease)")
	writes := fs.Int("writes", 3, "writes each leader makes before it is killed")
	every := fs.Duration("every", 50*time.Millisecond, "pause between the leader's writes")
	verbose := fs.Bool("v", false, "print every write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kill != "cut" && *kill != "revoke" {
		return fmt.Errorf("-kill %q: want cut or revoke", *kill)
	}
	var eps []string
	if *endpoints == "" {
		cluster, err := etcdtest.StartEtcd("", 1)
		if err != nil {
			return err
		}
		defer cluster.Close()
		eps = cluster.Endpoints()
		fmt.Fprintf(out, "no -endpoints: started an embedded etcd at %s\n", eps[0])
	} else {
		eps = strings.Split(*endpoints, ",")
	}
	admin, err := newClient(eps)
	if err != nil {
		return err
	}
	defer admin.Close()

	svc := &service{out: out, verbose: *verbose, every: *every, leading: map[string]chan struct{}{}}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var replicas []*replica
	defer func() {
		cancel()
		for _, r := range replicas {
			r.proxy.Mend()
			<-r.done
			_ = r.sess.Close()
			r.proxy.Close()
		}
	}()
	started := make(chan *replica, 16)
	for i := range 3 { // three replicas at a time: a new one joins when one is killed
		r, err := svc.start(ctx, fmt.Sprintf("replica-%d", i+1), eps[0], *ttl, started)
		if err != nil {
			return err
		}
		replicas = append(replicas, r)
	}
	for k := 0; ; k++ {
		var r *replica
		select {
		case r = <-started:
		case <-ctx.Done():
			return ctx.Err()
		}
		time.Sleep(time.Duration(*writes) * *every) // let it work
		if k == *kills {
			break
		}
		svc.mu.Lock()
		svc.lastAt = time.Now()
		fmt.Fprintf(out, "killing %s mid-term (%s)\n", r.name, map[string]string{"cut": "connection cut: its lease expires within the TTL", "revoke": "lease revoked"}[*kill])
		svc.mu.Unlock()
		if *kill == "cut" {
			r.proxy.Blackhole()
		} else if _, err := admin.Revoke(ctx, r.sess.Lease()); err != nil {
			return err
		}
		nr, err := svc.start(ctx, fmt.Sprintf("replica-%d", len(replicas)+1), eps[0], *ttl, started)
		if err != nil {
			return err
		}
		replicas = append(replicas, nr)
	}
	cancel()
	for _, r := range replicas {
		r.proxy.Mend()
		<-r.done
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	resp, err := admin.Get(rctx, recordKey)
	if err != nil {
		return err
	}
	record := "(none)"
	if len(resp.Kvs) == 1 {
		record = string(resp.Kvs[0].Value)
	}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	fmt.Fprintf(out, "terms=%v writes=%d refused=%d record=%q\n", svc.terms, svc.writes, svc.refused, record)
	return nil
}

func newClient(eps []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// start starts a replica: a client through a proxy to endpoint, a session,
// and leader.Run on the election. Each term it starts is sent on started.
func (s *service) start(ctx context.Context, name, endpoint string, ttl time.Duration, started chan<- *replica) (*replica, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, err
	}
	host := u.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = endpoint
	}
	p, err := embedtest.NewProxy(host)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sess, err := etcd.Dial(sctx, []string{p.URL()}, etcd.WithTTL(ttl))
	if err != nil {
		p.Close()
		return nil, err
	}
	e, err := etcd.NewElection(sess, electionName)
	if err != nil {
		p.Close()
		return nil, err
	}
	r := &replica{name: name, proxy: p, sess: sess, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		err := leader.Run(ctx, e, leader.Config[*etcd.Grant]{
			Value:            []byte(name),
			ResignOnCancel:   true,
			OnStartedLeading: func(ctx context.Context, g *etcd.Grant) { s.lead(ctx, r, g, started) },
			OnStoppedLeading: func(g *etcd.Grant) {
				if s.verbose {
					s.printf("%s stopped leading (term %d): %v", name, g.Token(), context.Cause(g.Context()))
				}
			},
		})
		if err != nil && s.verbose {
			s.printf("%s: %v", name, err) // its session was lost: a real replica would restart
		}
	}()
	return r, nil
}

// lead is the leader's work: guarded writes of the record, stamped with the
// term, until leadership ends.
func (s *service) lead(ctx context.Context, r *replica, g *etcd.Grant, started chan<- *replica) {
	s.mu.Lock()
	s.terms = append(s.terms, g.Token())
	after := ""
	if !s.lastAt.IsZero() {
		after = fmt.Sprintf(", %d ms after the kill", time.Since(s.lastAt).Milliseconds())
	}
	fmt.Fprintf(s.out, "%s leads (term %d%s)\n", r.name, g.Token(), after)
	s.mu.Unlock()
	started <- r
	for seq := 1; ctx.Err() == nil; seq++ {
		value := fmt.Sprintf("term=%d seq=%d by=%s", g.Token(), seq, r.name)
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := g.Txn(wctx, clientv3.OpPut(recordKey, value))
		cancel()
		s.mu.Lock()
		switch {
		case err == nil:
			s.writes++
			if s.verbose {
				fmt.Fprintf(s.out, "%s wrote %s\n", r.name, value)
			}
		case errors.Is(err, holdfast.ErrNotHeld):
			s.refused++
			fmt.Fprintf(s.out, "%s: write refused, no longer leader\n", r.name)
		}
		s.mu.Unlock()
		t := time.NewTimer(s.every)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	s.printf("%s: leadership ended (%v)", r.name, context.Cause(ctx))
}
