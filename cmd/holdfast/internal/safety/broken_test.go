//go:build !holdfast_mutants

package safety

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// TestBrokenVariants shows that the suite can fail: it builds this
// package's tests with the tag holdfast_mutants (see internal/mutant; it
// also runs core's TestSetClockRate, of the clock-rate hook, there) and
// runs the scenarios of variants_test.go once as they are (they must pass)
// and once with each broken variant (they must fail, on a checker):
//
//   - core/margin: a deadline without margin, with the clients' clock 18%
//     slow (TestSlowClockMargin);
//   - etcd/recheck-own-key: a waiter that does not re-check its own key
//     (TestWaiterKeysDeleted);
//   - etcd/release-guard: an Unlock that is not guarded
//     (TestHolderKeyDeleted).
func TestBrokenVariants(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "safety-variants.test")
	if out, err := exec.Command("go", "test", "-c", "-tags", "holdfast_mutants", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building the variants: %v\n%s", err, out)
	}
	// The clock-rate hook the margin's scenario relies on (core.SetClockRate).
	if out, err := exec.Command("go", "test", "-tags", "holdfast_mutants", "-count=1", "-run", "^TestSetClockRate$", "github.com/holdfast/holdfast/internal/core").CombinedOutput(); err != nil {
		t.Fatalf("the clock-rate hook: %v\n%s", err, out)
	}
	runs := []struct {
		mutant, run string
	}{
		{"", "^(TestSlowClockMargin|TestWaiterKeysDeleted|TestHolderKeyDeleted)$"},
		{"core/margin", "^TestSlowClockMargin$"},
		{"etcd/recheck-own-key", "^TestWaiterKeysDeleted$"},
		{"etcd/release-guard", "^TestHolderKeyDeleted$"},
	}
	outs := make([][]byte, len(runs))
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(bin, "-test.v", "-test.count=1", "-test.timeout=5m", "-test.run", r.run)
			cmd.Env = append(os.Environ(), "HOLDFAST_MUTANT="+r.mutant)
			outs[i], errs[i] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	checker := regexp.MustCompile(`(?m)^\s+\S+\.go:\d+: (told first|fence|release|not linearizable): .*$`)
	for i, r := range runs {
		out, err := outs[i], errs[i]
		summary := summaries(out)
		if r.mutant == "" {
			t.Logf("as they are: %v\n%s", err, summary)
			if err != nil {
				t.Errorf("the variant scenarios fail without a variant: %v\n%s", err, tail(out))
			}
			continue
		}
		found := checker.FindAll(out, 5)
		t.Logf("variant %s: %v\n%s\n%s", r.mutant, err, summary, bytes.Join(found, []byte("\n")))
		switch {
		case err == nil:
			t.Errorf("variant %s: the scenario passed; the checkers did not notice\n%s", r.mutant, tail(out))
		case bytes.Contains(out, []byte("panic:")) || len(found) == 0:
			t.Errorf("variant %s: failed, but not on a checker\n%s", r.mutant, tail(out))
		}
	}
}

// summaries returns the scenario summaries in a test's verbose output.
func summaries(out []byte) string {
	var b strings.Builder
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l)
		for _, p := range []string{"backend:", "faults injected:", "operations:", "fenced writes:", "violations:", "grants a fault ended:", "--- "} {
			if strings.HasPrefix(l, p) {
				b.WriteString(l + "\n")
			}
		}
	}
	return b.String()
}

func tail(out []byte) string {
	if len(out) > 4000 {
		out = out[len(out)-4000:]
	}
	return string(out)
}
