package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"runtime/debug"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

var devCommand = &command{
	name:    "dev",
	summary: "run an embedded one-node etcd on 127.0.0.1 for local development",
	usage: `usage: holdfast dev [flags]

Starts a one-node etcd inside this process, listening on 127.0.0.1 only,
prints its endpoint and its peer port (--peer-port, else --port + 1, else a
free port when that one is taken), and serves until interrupted (SIGINT or SIGTERM). Its
data lives in --data-dir, or in a temporary directory removed at exit. Point
holdfast (--endpoints), etcdctl or your program at the printed endpoint.
Not for production: one member, no TLS, no auth.`,
	flags: devFlags,
}

func devFlags(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	port := fs.Int("port", 2379, "client port on 127.0.0.1")
	peerPort := fs.Int("peer-port", 0, "peer port on 127.0.0.1 (default: --port + 1, or a free port if that one is taken)")
	dataDir := fs.String("data-dir", "", "data directory, kept at exit (default: a temporary directory, removed at exit)")
	return func(ctx context.Context, e *env, args []string) error {
		switch {
		case len(args) > 0:
			return usagef("dev takes no arguments")
		case *port < 1 || *port > 65535 || flagGiven(ctx, "peer-port") && (*peerPort < 1 || *peerPort > 65535):
			return usagef("--port and --peer-port must be in 1..65535")
		case *port == *peerPort:
			return usagef("--port and --peer-port must differ")
		}
		peer := *peerPort
		if !flagGiven(ctx, "peer-port") {
			var err error
			if peer, err = derivePeerPort(*port); err != nil {
				return err
			}
		}
		return runDev(ctx, e, *port, peer, *dataDir)
	}
}

// derivePeerPort is port + 1 (2380 for etcd's 2379) if it is free on
// 127.0.0.1, else a free port the system picks.
func derivePeerPort(port int) (int, error) {
	if port < 65535 {
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+1)); err == nil {
			ln.Close()
			return port + 1, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("no free peer port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// devReadyTimeout bounds how long the dev server may take to start.
const devReadyTimeout = 30 * time.Second

func runDev(ctx context.Context, e *env, port, peerPort int, dir string) error {
	if dir == "" {
		tmp, err := os.MkdirTemp("", "holdfast-dev-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg := embed.NewConfig()
	cfg.Name = "holdfast-dev"
	cfg.Dir = dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.LogLevel = "error"
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd on %s: %w", client.Host, err)
	}
	defer srv.Close()
	select {
	case <-srv.Server.ReadyNotify():
	case err := <-srv.Err():
		return fmt.Errorf("etcd failed while starting: %w", err)
	case <-time.After(devReadyTimeout):
		return fmt.Errorf("etcd not ready within %v", devReadyTimeout)
	case <-ctx.Done():
		return nil
	}
	fmt.Fprintf(e.stdout, "etcd serving on %s (peer port %d; data in %s); stop with Ctrl-C\n", client.String(), peerPort, dir)
	fmt.Fprintf(e.stdout, "try: holdfast lock --endpoints %s demo/lock -- sh -c 'echo token $HOLDFAST_TOKEN'\n", client.Host)
	select {
	case <-ctx.Done():
		fmt.Fprintln(e.stdout, "stopping etcd")
		return nil
	case err := <-srv.Err():
		return fmt.Errorf("etcd stopped: %w", err)
	}
}

var versionCommand = &command{
	name:    "version",
	summary: "print holdfast's version and the versions it was built with",
	usage:   "usage: holdfast version",
	flags: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		return func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usagef("version takes no arguments")
			}
			fmt.Fprintln(e.stdout, versionString())
			return nil
		}
	},
}

// versionString is the module's version (or VCS revision) and the versions
// of Go and of the store clients it was built with.
func versionString() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "holdfast (unknown version)"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && (v == "" || v == "(devel)") {
			v = "devel " + s.Value
		}
	}
	out := fmt.Sprintf("holdfast %s %s", v, bi.GoVersion)
	for _, d := range bi.Deps {
		switch d.Path {
		case "go.etcd.io/etcd/client/v3", "github.com/hashicorp/consul/api":
			out += fmt.Sprintf(" %s@%s", d.Path, d.Version)
		}
	}
	return out
}
