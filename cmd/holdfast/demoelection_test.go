package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestElectionAct runs the demo's third act and checks its summary: a
// failover within TTL + 0.5 s, the frozen leader told first, a higher
// term, and the frozen leader's stale write refused.
func TestElectionAct(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd and runs for about 3 s")
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := runElectionAct(ctx, &out, defaultElectionAct)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !res.ok(defaultElectionAct) || res.Stale != 1 || res.Terms[1] <= res.Terms[0] {
		t.Errorf("result %+v", res)
	}
	for _, want := range []string{"Act 3: leader election", "FREEZES", "told it lost leadership", "stale write REJECTED", "act 3 summary: terms="} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	s := out.String()
	if told, next := strings.Index(s, "told it lost leadership"), strings.Index(s, "ms after the freeze"); told < 0 || next < 0 || told > next {
		t.Errorf("the frozen leader was not told before the next leader started")
	}
}
