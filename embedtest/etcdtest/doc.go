// Package etcdtest starts an in-process etcd cluster of one or more members
// (go.etcd.io/etcd/server/v3/embed) for tests, the demo, the CLI's dev mode
// and benchmarks.
//
// It is a module of its own (github.com/holdfast/holdfast/embedtest/etcdtest)
// because the server's dependencies are many: a module that imports it gets
// them, a module that imports only the library or embedtest does not.
//
// Members listen on 127.0.0.1 only, on free ports chosen at start (shared
// with embedtest's servers, so that servers started by one process never
// collide), and are stopped by Close or, for Etcd and EtcdCluster, by
// t.Cleanup. They run with the default heartbeat (100 ms) and election
// timeout (1 s), so the server's minimum lease TTL is 2 s, and log at error
// level only.
//
// Secured servers: WithEtcdTLS serves the client URLs over TLS, mutual TLS
// optionally, with an embedtest.PKI; WithEtcdAuth enables etcd's
// authentication with a root user (Cluster.AddUser adds users confined to
// key prefixes). Cluster.NewClient connects with the matching credentials.
package etcdtest
