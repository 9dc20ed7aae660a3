// Package leader runs a fenced leader election loop on either store, like
// Kubernetes' leader election, on the stores these teams already run.
//
// A Candidate is one backend's election on one name (*etcd.Election,
// *consul.Election). Run campaigns with it until its context ends: each
// time the candidate wins, OnStartedLeading runs under the leadership's
// context, which the backend cancels when leadership is lost, before any
// other candidate can win; then OnStoppedLeading, and Run campaigns again.
// OnNewLeader follows the leader changes meanwhile.
//
// The leadership is a grant of the backend's type (G), so the leader's
// writes are fenced without a type assertion: use the grant's Token (the
// term) as a fencing token at the resource, or the backend's guarded
// transactions (etcd Grant.Txn, Consul Grant.Txn), which commit only while
// the leadership holds.
//
// Failover time: after a leader crashes, another candidate wins once the
// store frees its key: on etcd when its lease expires (within the session
// TTL), at once if the lease is revoked (Session.Close, or an operator's
// revoke); on Consul when its session is invalidated (within 2 x TTL for
// a crash, at once if it is destroyed) plus the session's lock-delay.
package leader
