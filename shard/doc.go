// Package shard shares N shards (tenants, queue partitions, key ranges)
// among the members of a group, on either store: each shard is owned by
// one member at a time, through a holdfast lock per shard, so that its
// work is fenced by the lock's tokens; the shards are balanced over the
// live members, and move as few as possible when members join or leave.
//
// A member is a session (Store: Etcd or Consul) running Group.Run:
//
//	s, _ := etcd.NewSession(ctx, cli)
//	g, _ := shard.New(shard.Etcd(s), "tenants", shard.Config{Shards: 64})
//	err := g.Run(ctx, func(ctx context.Context, sh shard.Shard, grant *etcd.Grant) {
//		// work on shard sh until ctx ends; fence writes with grant
//	})
//
// # Keys
//
// A group called "tenants" keeps, in the store:
//   - "tenants/.members/<session ID>": a member's key, held by its session
//     (etcd: bound to its lease; Consul: acquired with its session), whose
//     value says its Config.Member and the group's shards;
//   - "tenants/<shard name>/...": the keys of each shard's lock (an
//     etcd.Mutex or consul.Mutex called "tenants/<shard name>").
//
// # Assignment
//
// No coordinator: every member computes the assignment from the members it
// sees, by rendezvous hashing with bounded loads (see Group.Run). Members
// that see different sets for a moment may both want a shard; the shard's
// lock decides, so a shard is never owned twice, and the disagreement only
// delays the move until the views agree (milliseconds: every member follows
// the same keys).
//
// # Failures
//
// A member that crashes keeps its shards until the store ends its session
// (etcd: within the TTL; Consul: within 2 x TTL, then the lock-delay): its
// member key goes with the session, the others recompute, and the new
// owners, waiting for the locks, get them as soon as the store frees them.
// A member cut off from the store, or paused, is told first: each work's
// context ends with its grant, before the store can give the shard to
// another member, and the grant's guarded writes are refused from then on.
package shard
