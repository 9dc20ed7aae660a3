package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/holdfast/holdfast"
	hfconsul "github.com/holdfast/holdfast/consul"
	hfetcd "github.com/holdfast/holdfast/etcd"
	"github.com/holdfast/holdfast/leader"
)

// storeFlags are the flags that say which store to use and how: shared by
// every command that talks to a store.
type storeFlags struct {
	backend   *string
	endpoints *string
	addr      *string
	ttl       *time.Duration
	lockDelay *time.Duration
}

// addStoreFlags declares the store flags on fs. Defaults come from the
// environment variables the native tools read (ETCDCTL_ENDPOINTS,
// CONSUL_HTTP_ADDR; Consul's client also reads CONSUL_HTTP_TOKEN and its TLS
// variables), HOLDFAST_ENDPOINTS and HOLDFAST_BACKEND.
func addStoreFlags(fs *flag.FlagSet) *storeFlags {
	return &storeFlags{
		backend:   fs.String("backend", envOr("HOLDFAST_BACKEND", "etcd"), "store: etcd or consul ($HOLDFAST_BACKEND)"),
		endpoints: fs.String("endpoints", envOr("HOLDFAST_ENDPOINTS", envOr("ETCDCTL_ENDPOINTS", "127.0.0.1:2379")), "etcd endpoints, comma-separated ($HOLDFAST_ENDPOINTS, else $ETCDCTL_ENDPOINTS)"),
		addr:      fs.String("addr", envOr("CONSUL_HTTP_ADDR", "127.0.0.1:8500"), "Consul agent HTTP address ($CONSUL_HTTP_ADDR)"),
		ttl:       fs.Duration("ttl", 0, "session TTL: how long the store keeps a crashed holder's grants (default: etcd 15s, Consul 15s)"),
		lockDelay: fs.Duration("lock-delay", -1, "Consul only: the session's lock-delay, after which a lock whose holder's session was invalidated can be taken again (default 15s; 0 for none)"),
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// session is an open session on either store, with the constructors the
// commands need.
type session struct {
	backend string
	etcd    *hfetcd.Session
	consul  *hfconsul.Session
}

// open checks the flags and opens a session.
func (f *storeFlags) open(ctx context.Context) (*session, error) {
	switch *f.backend {
	case "etcd":
		if *f.lockDelay >= 0 {
			return nil, usagef("--lock-delay applies to Consul only")
		}
		var opts []hfetcd.SessionOption
		if *f.ttl != 0 {
			opts = append(opts, hfetcd.WithTTL(*f.ttl))
		}
		eps, err := endpointList("--endpoints", *f.endpoints)
		if err != nil {
			return nil, err
		}
		s, err := hfetcd.Dial(ctx, eps, opts...)
		if err != nil {
			return nil, err
		}
		return &session{backend: "etcd", etcd: s}, nil
	case "consul":
		var opts []hfconsul.SessionOption
		if *f.ttl != 0 {
			opts = append(opts, hfconsul.WithTTL(*f.ttl))
		}
		if *f.lockDelay >= 0 {
			opts = append(opts, hfconsul.WithLockDelay(*f.lockDelay))
		}
		s, err := hfconsul.Dial(ctx, *f.addr, opts...)
		if err != nil {
			return nil, err
		}
		return &session{backend: "consul", consul: s}, nil
	default:
		return nil, usagef("--backend %q: want etcd or consul", *f.backend)
	}
}

// mutex returns the lock called name on the session's store.
func (s *session) mutex(name string) (holdfast.Locker, error) {
	if s.etcd != nil {
		m, err := hfetcd.NewMutex(s.etcd, name)
		if err != nil {
			return nil, err
		}
		return holdfast.AsLocker(m), nil
	}
	m, err := hfconsul.NewMutex(s.consul, name)
	if err != nil {
		return nil, err
	}
	return holdfast.AsLocker(m), nil
}

// semaphore returns the semaphore called name with the given limit.
func (s *session) semaphore(name string, limit int) (holdfast.Locker, error) {
	if s.etcd != nil {
		m, err := hfetcd.NewSemaphore(s.etcd, name, limit)
		if err != nil {
			return nil, err
		}
		return holdfast.AsLocker(m), nil
	}
	m, err := hfconsul.NewSemaphore(s.consul, name, limit)
	if err != nil {
		return nil, err
	}
	return holdfast.AsLocker(m), nil
}

// candidate is either backend's election, with holdfast.Grant grants.
type candidate interface {
	Campaign(ctx context.Context, value []byte) (holdfast.Grant, error)
	Observe(ctx context.Context) <-chan holdfast.Leader
}

type anyCandidate[G holdfast.Grant] struct{ c leader.Candidate[G] }

func (a anyCandidate[G]) Campaign(ctx context.Context, value []byte) (holdfast.Grant, error) {
	g, err := a.c.Campaign(ctx, value)
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (a anyCandidate[G]) Observe(ctx context.Context) <-chan holdfast.Leader { return a.c.Observe(ctx) }

// election returns the election called name.
func (s *session) election(name string) (candidate, error) {
	if s.etcd != nil {
		e, err := hfetcd.NewElection(s.etcd, name)
		if err != nil {
			return nil, err
		}
		return anyCandidate[*hfetcd.Grant]{e}, nil
	}
	e, err := hfconsul.NewElection(s.consul, name)
	if err != nil {
		return nil, err
	}
	return anyCandidate[*hfconsul.Grant]{e}, nil
}

// Err returns why the session ended, or nil while it lives.
func (s *session) Err() error {
	if s.etcd != nil {
		return s.etcd.Err()
	}
	return s.consul.Err()
}

// Close closes the session: the store forgets whatever it still holds.
func (s *session) Close() error {
	if s.etcd != nil {
		return s.etcd.Close()
	}
	return s.consul.Close()
}

// nativeEnv returns the environment variables the native lock commands set
// for their child, for drop-in use: etcdctl lock's ETCD_LOCK_KEY and
// ETCD_LOCK_REV (ours is the key's create revision, the fencing token), and
// consul lock's CONSUL_LOCK_HELD.
func (s *session) nativeEnv(g holdfast.Grant) []string {
	if s.etcd != nil {
		return []string{"ETCD_LOCK_KEY=" + g.Key(), "ETCD_LOCK_REV=" + g.Token().String()}
	}
	return []string{"CONSUL_LOCK_HELD=true"}
}

// describe names the store for messages.
func (f *storeFlags) describe() string {
	if *f.backend == "consul" {
		return fmt.Sprintf("consul at %s", *f.addr)
	}
	return fmt.Sprintf("etcd at %s", *f.endpoints)
}
