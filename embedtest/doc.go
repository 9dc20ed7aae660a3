// Package embedtest starts real servers for tests, the demo, the CLI's dev
// mode and benchmarks: a real `consul agent -dev` process (or a cluster of
// Consul servers), and the fault proxy (Proxy) that pauses, blackholes and
// mends connections to any of them.
//
// Nothing is mocked. Every server listens on 127.0.0.1 only, on free ports
// chosen at start, and everything started is stopped again either by Close or,
// for the testing.TB helpers (Consul, ConsulServers, StartProxy, the Client
// methods), by t.Cleanup.
//
// The servers that need a Go module of their own live in nested modules, so
// that a module importing embedtest (or the library, whose tests import
// embedtest) does not inherit them: embedtest/etcdtest runs an in-process
// etcd cluster (go.etcd.io/etcd/server/v3), and embedtest/pgtest a throwaway
// PostgreSQL (with the pgx driver). Importing one of them is what brings its
// server's modules into a module's graph.
//
// Secured servers: NewPKI (TestPKI in tests) generates a CA with server and
// client certificates; WithACL and WithHTTPS start the Consul agent with
// ACLs (default deny) and HTTPS only, and etcdtest's WithEtcdTLS serves
// etcd's client URLs with the same PKI. The Client helpers connect with the
// matching credentials.
//
// The Consul binary is found by ConsulBinary: $CONSUL_BIN, or the path printed
// by the repository's scripts/consul.sh, which builds Consul once from its Go
// module source and caches it (the first build takes minutes).
package embedtest
