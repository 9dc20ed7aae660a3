package main

import (
	"bytes"
	"context"
	"regexp"
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
	t.Logf("shard-tenants:\n%s", out)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	ms := ` *\d+ ms  `
	steps := []string{
		`embedded etcd at http://127\.0\.0\.1:\d+, PostgreSQL on 127\.0\.0\.1:\d+`,
		ms + `3 workers start: settled in \d+ ms, tenants per worker \[4 4 4\]`,
		ms + `worker-4 joins: settled in \d+ ms, tenants per worker \[3 3 3 3\]`,
		ms + `worker-1 leaves: settled in \d+ ms, tenants per worker \[4 4 4\]`,
		`\d+ rows for 12 tenants; a tenant changed writer \d+ times; rows out of turn: 0`,
	}
	rest := out
	for _, s := range steps {
		loc := regexp.MustCompile(s).FindStringIndex(rest)
		if loc == nil {
			t.Fatalf("output lacks, in order, %q", s)
		}
		rest = rest[loc[1]:]
	}
}
