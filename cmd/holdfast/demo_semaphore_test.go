package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// TestDemoSemaphoreAct runs the demo's second act: every job runs, never
// more than the limit at once, the limit is reached, and etcd never holds
// more keys than the sessions.
func TestDemoSemaphoreAct(t *testing.T) {
	c := etcdtest.Etcd(t)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d := defaultSemaphoreDemo
	res, err := semaphoreAct(ctx, &out, c, d)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !res.ok(d) || res.MaxLive != d.Limit {
		t.Errorf("result %+v: want %d jobs, none over the limit, the limit %d reached, at most %d keys", res, d.Processes*d.Jobs, d.Limit, d.Processes*d.Sessions)
	}
	if !strings.Contains(out.String(), "0 over the limit") {
		t.Errorf("output lacks the summary")
	}
}
