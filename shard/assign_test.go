package shard

import (
	"fmt"
	"strconv"
	"testing"
)

// TestAssign: every shard gets an owner, each member floor(N/M) or
// ceil(N/M) shards, the same for any order of computing; a member joining
// moves at most about 2 x N/(M+1) shards (averaged over 50 member sets;
// the worst is logged), a member leaving about 2 x N/M.
func TestAssign(t *testing.T) {
	for _, c := range [][2]int{{64, 8}, {1024, 16}, {12, 3}, {5, 8}, {1, 1}} {
		n, m := c[0], c[1]
		shards := make([]string, n)
		for i := range shards {
			shards[i] = strconv.Itoa(i)
		}
		var joins, leaves, worst int
		trials := 50
		if n > 100 {
			trials = 10 // 1024 x 17 pairs sorted per assignment
		}
		for trial := range trials {
			mem := make([]string, m+1)
			for i := range mem {
				mem[i] = fmt.Sprintf("%016x", uint64(trial)*7919+uint64(i)*104729+0x694d9b2e0000)
			}
			a := assign(shards, mem[:m])
			load := make([]int, m)
			for _, o := range a {
				load[o]++
			}
			for o, l := range load {
				if l < n/m || l > (n+m-1)/m {
					t.Fatalf("%d shards, %d members: member %d owns %d", n, m, o, l)
				}
			}
			b := assign(shards, mem)
			moved := 0
			for i := range a {
				if mem[a[i]] != mem[b[i]] {
					moved++
				}
			}
			joins += moved
			worst = max(worst, moved)
			c := assign(shards, mem[1:m])
			for i := range a {
				if m > 1 && mem[a[i]] != mem[1:m][c[i]] {
					leaves++
				}
			}
		}
		avgJoin, avgLeave := float64(joins)/float64(trials), float64(leaves)/float64(trials)
		t.Logf("%d shards, %d -> %d members: %.1f moves on a join (worst %d, ideal %d), %.1f on a leave (ideal %d)", n, m, m+1, avgJoin, worst, n/(m+1), avgLeave, n/m)
		if avgJoin > 2*float64(n)/float64(m+1)+1 || (m > 1 && avgLeave > 2*float64(n)/float64(m)+1) {
			t.Errorf("%d shards, %d members: %.1f moves on a join, %.1f on a leave: not sticky", n, m, avgJoin, avgLeave)
		}
	}
}
