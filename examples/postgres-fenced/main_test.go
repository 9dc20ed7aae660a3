package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/leakcheck"
)

// TestMain fails the package if the example leaves a goroutine running once
// the tests are done.
func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var buf bytes.Buffer
	err := run(ctx, &buf, nil)
	out := buf.String()
	t.Logf("postgres-fenced:\n%s", out)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	ms := ` *\d+ ms  `
	steps := []string{
		`embedded etcd at http://127\.0\.0\.1:\d+, PostgreSQL on 127\.0\.0\.1:\d+`,
		ms + `worker-1  holds the lock \(token \d+\)`,
		ms + `postgres  committed \+100 from worker-1`,
		ms + `worker-1  PAUSES`,
		ms + `worker-2  holds the lock \(token \d+\) after worker-1's lease expired`,
		ms + `postgres  committed \+10 from worker-2`,
		ms + `worker-1  had been told it lost the lock: holdfast: grant lost`,
		ms + `postgres  REFUSED worker-1's late \+1000: holdfast: stale fencing token: jobs/ledger has admitted token \d+, this write carries \d+`,
		`balance 110 \(highest token admitted \d+\); late writes refused: 1`,
	}
	rest := out
	for _, s := range steps {
		loc := regexp.MustCompile(s).FindStringIndex(rest)
		if loc == nil {
			t.Fatalf("output lacks, in order, %q", s)
		}
		rest = rest[loc[1]:]
	}
	if strings.Contains(out, "ACCEPTED") || strings.Contains(out, "NOT told") {
		t.Error("fencing failed")
	}
}
