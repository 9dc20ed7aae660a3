package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
	"github.com/holdfast/holdfast/embedtest/leakcheck"
)

// TestMain fails the package if the example leaves a goroutine running once
// the tests are done.
func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func runService(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out, args)
	t.Logf("leader-service %s:\n%s", strings.Join(args, " "), out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return out.String()
}

var (
	leadsRe   = regexp.MustCompile(`^(replica-\d+) leads \(term (\d+)(?:, (\d+) ms after the kill)?\)$`)
	wroteRe   = regexp.MustCompile(`^(replica-\d+) wrote term=(\d+) seq=(\d+) by=(replica-\d+)$`)
	summaryRe = regexp.MustCompile(`^terms=\[([\d ]*)\] writes=(\d+) refused=(\d+) record="term=(\d+) seq=(\d+) by=(replica-\d+)"$`)
)

// check checks the output of a run with kills kills: one more term than
// kills, terms increasing, each failover within bound, writes stamped with
// the writer's own current term and never with an older term after a newer
// one, and a record that is the last write.
func check(t *testing.T, out string, kills int, bound time.Duration) {
	t.Helper()
	var terms []int64
	leaderOf := map[int64]string{}
	var lastWrite string
	var top int64
	summary := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		switch {
		case leadsRe.MatchString(line):
			m := leadsRe.FindStringSubmatch(line)
			term, _ := strconv.ParseInt(m[2], 10, 64)
			if len(terms) > 0 && term <= terms[len(terms)-1] {
				t.Errorf("term %d after %d", term, terms[len(terms)-1])
			}
			terms = append(terms, term)
			leaderOf[term] = m[1]
			if len(terms) > 1 {
				ms, err := strconv.Atoi(m[3])
				if err != nil {
					t.Errorf("no failover time in %q", line)
				} else if d := time.Duration(ms) * time.Millisecond; d > bound {
					t.Errorf("failover took %v, more than %v: %q", d, bound, line)
				}
			}
		case wroteRe.MatchString(line):
			m := wroteRe.FindStringSubmatch(line)
			term, _ := strconv.ParseInt(m[2], 10, 64)
			if leaderOf[term] != m[1] || m[1] != m[4] {
				t.Errorf("write by a replica that does not lead that term: %q", line)
			}
			if term < top {
				t.Errorf("write of term %d after one of term %d: %q", term, top, line)
			}
			top = term
			lastWrite = strings.TrimPrefix(line, m[1]+" wrote ")
		case summaryRe.MatchString(line):
			summary++
			m := summaryRe.FindStringSubmatch(line)
			if got := "term=" + m[4] + " seq=" + m[5] + " by=" + m[6]; got != lastWrite {
				t.Errorf("record %q, last write %q", got, lastWrite)
			}
		}
	}
	if summary != 1 {
		t.Fatalf("%d summary lines", summary)
	}
	if len(terms) != kills+1 {
		t.Errorf("%d terms, want %d", len(terms), kills+1)
	}
}

// TestEmbedded: two leaders cut off mid-term; each failover within TTL +
// 0.5 s (2.5 s), with slack for a loaded machine.
func TestEmbedded(t *testing.T) {
	out := runService(t, "-v")
	if !strings.HasPrefix(out, "no -endpoints: started an embedded etcd at http://127.0.0.1:") {
		t.Errorf("output does not start by saying it started an embedded etcd")
	}
	check(t, out, 2, 2500*time.Millisecond+500*time.Millisecond)
}

// TestRevoke: leaders whose lease is revoked are replaced at once; the
// etcd given with -endpoints is left clean.
func TestRevoke(t *testing.T) {
	cluster := etcdtest.Etcd(t)
	out := runService(t, "-endpoints", strings.Join(cluster.Endpoints(), ","), "-kill", "revoke", "-kills", "3", "-v")
	check(t, out, 3, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	left, err := cluster.Client(t).Get(ctx, electionName+"/", clientv3.WithPrefix())
	if err != nil || len(left.Kvs) != 0 {
		t.Errorf("candidate keys left: %v %v", err, left.Kvs)
	}
}
