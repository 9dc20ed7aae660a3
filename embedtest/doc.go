// Package embedtest starts real servers for tests, the demo, the CLI's dev
// mode and benchmarks: an in-process etcd cluster (go.etcd.io/etcd/server/v3/embed)
// of one or more members, and a real `consul agent -dev` process.
//
// Nothing is mocked. Every server listens on 127.0.0.1 only, on free ports
// chosen at start, and everything started is stopped again either by Close or,
// for the testing.TB helpers (Etcd, EtcdCluster, Consul, the Client methods),
// by t.Cleanup.
//
// etcd members run with the default heartbeat (100 ms) and election timeout
// (1 s), so the server's minimum lease TTL is 2 s. Servers log at error level
// only.
//
// Secured servers: NewPKI (TestPKI in tests) generates a CA with server and
// client certificates; WithEtcdTLS serves etcd's client URLs over TLS,
// mutual TLS optionally, and WithEtcdAuth enables etcd's authentication with
// a root user (Cluster.AddUser adds users confined to key prefixes);
// WithACL and WithHTTPS start the Consul agent with ACLs (default deny) and
// HTTPS only. The Client helpers connect with the matching credentials.
//
// The Consul binary is found by ConsulBinary: $CONSUL_BIN, or the path printed
// by the repository's scripts/consul.sh, which builds Consul once from its Go
// module source and caches it (the first build takes minutes).
package embedtest
