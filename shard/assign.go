package shard

import (
	"cmp"
	"hash/fnv"
	"slices"
)

// assign returns the owner of every shard (an index into members) for the
// live members, sorted by ID: rendezvous hashing with bounded loads.
//
// Every (shard, member) pair gets a score, a hash of both names; pairs are
// taken in order of decreasing score, and a pair gives its shard to its
// member if the shard has no owner yet and the member owns fewer than
// floor(N/M) shards, or exactly floor(N/M) while some of the N mod M
// members allowed ceil(N/M) are still unclaimed. So every member owns
// floor(N/M) or ceil(N/M) shards, and the result depends only on the set of
// members: every member computes the same assignment from the same view.
// A member's joining or leaving changes the scores of no other pair, so
// only the shards it takes or leaves, and the few its change of capacity
// pushes on, move.
func assign(shards []string, members []string) []int {
	n, m := len(shards), len(members)
	owner := make([]int, n)
	if m == 0 {
		for i := range owner {
			owner[i] = -1
		}
		return owner
	}
	type pair struct {
		score        uint64
		shard, owner int
	}
	pairs := make([]pair, 0, n*m)
	for s, sn := range shards {
		for o, mn := range members {
			pairs = append(pairs, pair{score(sn, mn), s, o})
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		if c := cmp.Compare(a.shard, b.shard); c != 0 {
			return c
		}
		return cmp.Compare(a.owner, b.owner)
	})
	base, extra := n/m, n%m
	load := make([]int, m)
	for i := range owner {
		owner[i] = -1
	}
	left := n
	for _, p := range pairs {
		if left == 0 {
			break
		}
		if owner[p.shard] >= 0 {
			continue
		}
		switch {
		case load[p.owner] < base:
		case load[p.owner] == base && extra > 0:
			extra--
		default:
			continue
		}
		owner[p.shard] = p.owner
		load[p.owner]++
		left--
	}
	return owner
}

// score is the rendezvous hash of a shard and a member.
func score(shard, member string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(shard))
	h.Write([]byte{0})
	h.Write([]byte(member))
	x := h.Sum64()
	// splitmix64's finalizer: FNV's low bits alone mix poorly.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
