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

// runTransfer runs the example in-process, bounded, and returns its output.
func runTransfer(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out, args)
	t.Logf("transfer %s:\n%s", strings.Join(args, " "), out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return out.String()
}

var summaryRe = regexp.MustCompile(`(?m)^transfers=(\d+) total before=(\d+) after=(\d+)$`)

// checkSummary checks that every transfer was made and the total kept.
func checkSummary(t *testing.T, out string, transfers, total int) {
	t.Helper()
	m := summaryRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary line in the output")
	}
	n, _ := strconv.Atoi(m[1])
	before, _ := strconv.Atoi(m[2])
	after, _ := strconv.Atoi(m[3])
	if n != transfers || before != total || after != total {
		t.Errorf("transfers=%d before=%d after=%d, want %d transfers and a total of %d throughout", n, before, after, transfers, total)
	}
}

func TestEmbedded(t *testing.T) {
	out := runTransfer(t)
	if !strings.HasPrefix(out, "no -endpoints: started an embedded etcd at http://127.0.0.1:") {
		t.Errorf("output does not start by saying it started an embedded etcd")
	}
	checkSummary(t, out, 4*25, 5*100)
}

// TestContended: 8 workers on 3 accounts (every pair locked in both orders
// many times): no deadlock, every transfer made, the total kept; tokens
// printed with -v are non-zero. Run twice against one etcd: the balances
// carry over and the total is still kept.
func TestContended(t *testing.T) {
	cluster := etcdtest.Etcd(t)
	eps := strings.Join(cluster.Endpoints(), ",")
	for range 2 {
		out := runTransfer(t, "-endpoints", eps, "-workers", "8", "-accounts", "3", "-transfers", "20", "-v")
		checkSummary(t, out, 8*20, 3*100)
		lines := regexp.MustCompile(`(?m)^worker-\d+: acct-\d -> acct-\d: \d+ \(tokens [1-9]\d*, [1-9]\d*\)$`).FindAllString(out, -1)
		if len(lines) != 8*20 {
			t.Errorf("%d transfer lines with non-zero tokens, want %d", len(lines), 8*20)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	left, err := cluster.Client(t).Get(ctx, lockPrefix, clientv3.WithPrefix())
	if err != nil || len(left.Kvs) != 0 {
		t.Errorf("lock keys left: %v, %v", err, left.Kvs)
	}
}
