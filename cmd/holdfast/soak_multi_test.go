package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestSoakMulti: a short soak of the two-name lock (clients pass the names
// in random orders) on etcd and on Consul, under the scenarios' faults:
// the summary passes every checker on the main name, and grants were made.
func TestSoakMulti(t *testing.T) {
	for _, backend := range []string{"etcd", "consul"} {
		t.Run(backend, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, []string{"soak", "--backend", backend, "--primitive", "multi", "--duration", "15s"})
			out := stdout.String()
			t.Logf("\n%s%s", out, stderr.String())
			if code != 0 {
				t.Fatalf("exit %d", code)
			}
			for _, want := range []string{", multi, 15s", "violations: fence=0 told_first=0", "linearizable=Ok keys_left=0"} {
				if !strings.Contains(out, want) {
					t.Errorf("summary lacks %q", want)
				}
			}
		})
	}
}
