package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/leakcheck"
)

// TestMain fails the package if the example leaves a goroutine running once
// the tests are done.
func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var buf bytes.Buffer
	err := run(ctx, &buf, nil)
	out := buf.String()
	t.Logf("fenced-resource:\n%s", out)
	if err != nil {
		t.Fatalf("run: %v", err)
	}

	// The timeline, in this order; T1 is worker-1's token, T2 worker-2's.
	ms := ` *\d+ ms  `
	steps := []string{
		`embedded etcd at http://127\.0\.0\.1:\d+ \(temporary directory\)`,
		ms + `worker-1  holds the lock \(token (?P<t1>\d+)\)`,
		ms + `storage   accepted v1 from worker-1 \(token (?P<v1>\d+)\)`,
		ms + `worker-1  sends v2 \(token (?P<v2>\d+)\), slow to arrive`,
		ms + `worker-2  waits for the lock`,
		ms + `operator  revoked worker-1's lease`,
		ms + `worker-2  holds the lock \(token (?P<t2>\d+)\)`,
		ms + `storage   accepted v3 from worker-2 \(token (?P<v3>\d+)\)`,
		ms + `storage   REJECTED v2 from worker-1: holdfast: stale fencing token: (?P<s1>\d+) < (?P<s2>\d+)`,
		ms + `worker-1  is told: holdfast: grant lost: .*`,
		ms + `worker-1  Unlock: holdfast: grant not held: .*`,
		`storage holds "v3 by worker-2" \(highest token (?P<max>\d+)\)`,
		`stale writes rejected: 1`,
	}
	re := regexp.MustCompile(`\A` + strings.Join(steps, `\n`) + `\n\z`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("output is not the expected timeline:\n%s", strings.Join(steps, "\n"))
	}
	tok := func(name string) uint64 {
		n, _ := strconv.ParseUint(m[re.SubexpIndex(name)], 10, 64)
		return n
	}
	t1, t2 := tok("t1"), tok("t2")
	if t1 == 0 || t2 <= t1 {
		t.Errorf("tokens: worker-1 %d, worker-2 %d; want 0 < worker-1's < worker-2's", t1, t2)
	}
	// Every write carries its writer's token; the rejection names both
	// tokens; the fence keeps worker-2's.
	if tok("v1") != t1 || tok("v2") != t1 || tok("s1") != t1 || tok("v3") != t2 || tok("s2") != t2 || tok("max") != t2 {
		t.Errorf("tokens v1 %d, v2 %d, v3 %d, rejected %d < %d, highest %d; want worker-1's %d for v1 and v2, worker-2's %d for v3 and highest",
			tok("v1"), tok("v2"), tok("v3"), tok("s1"), tok("s2"), tok("max"), t1, t2)
	}
}

func TestArgs(t *testing.T) {
	if err := run(context.Background(), new(bytes.Buffer), []string{"-x"}); err == nil {
		t.Errorf("run with an argument: no error")
	}
}
