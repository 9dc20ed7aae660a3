// Package leakcheck finds goroutines that tests leave running. It is test
// support shared by holdfast's packages and examples.
package leakcheck

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

const (
	// goroutineTolerance is how many more goroutines than at the start
	// Check accepts at the end (runtime and testing helpers come
	// and go).
	goroutineTolerance = 2
	// goroutineWait is how long Check waits for goroutines to end.
	goroutineWait = 5 * time.Second
	// holdfastFrame marks the stack frames Check reports first.
	holdfastFrame = "github.com/holdfast/holdfast"
)

// Check fails t if, when t ends, more goroutines are running than
// when Check was called (give or take a small tolerance for the
// runtime and the testing package). It waits up to about 5 s for
// goroutines to end before it fails, and then reports the stacks of the
// goroutines started since the call, those with holdfast frames first.
//
// Call it first in a test, before anything that registers its own cleanup
// (servers, clients, sessions), so that its check runs last, after they are
// all closed. It counts every goroutine of the process: do not use it in a
// test that runs in parallel with others.
func Check(t *testing.T) {
	t.Helper()
	start := runtime.NumGoroutine()
	before := make(map[string]bool)
	for _, g := range goroutines() {
		before[g.id] = true
	}
	t.Cleanup(func() {
		deadline := time.Now().Add(goroutineWait)
		var n int
		for {
			n = runtime.NumGoroutine()
			if n <= start+goroutineTolerance {
				return
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		var ours, others []goroutine
		for i, g := range goroutines() {
			if i == 0 || before[g.id] { // 0 is this cleanup's own goroutine
				continue
			}
			if strings.Contains(g.stack, holdfastFrame) {
				ours = append(ours, g)
			} else {
				others = append(others, g)
			}
		}
		var b strings.Builder
		fmt.Fprintf(&b, "goroutine leak: %d goroutines when the test started, %d after waiting %v at its end (tolerance %d); %d new goroutines have holdfast frames, %d do not",
			start, n, goroutineWait, goroutineTolerance, len(ours), len(others))
		const max = 10
		for i, g := range ours {
			if i == max {
				fmt.Fprintf(&b, "\n... and %d more with holdfast frames", len(ours)-max)
				break
			}
			fmt.Fprintf(&b, "\n\n%s", g.stack)
		}
		if len(others) > 0 {
			fmt.Fprintf(&b, "\n\nnew goroutines without holdfast frames, by the function they run:")
			counts := make(map[string]int)
			var order []string
			for _, g := range others {
				if counts[g.top] == 0 {
					order = append(order, g.top)
				}
				counts[g.top]++
			}
			for _, top := range order {
				fmt.Fprintf(&b, "\n  %4d  %s", counts[top], top)
			}
		}
		t.Error(b.String())
	})
}

// goroutine is one goroutine of a runtime.Stack(all) dump.
type goroutine struct {
	id    string // "goroutine 42"
	top   string // the function the goroutine runs, and its creator
	stack string
}

// goroutines parses the stacks of every goroutine, the calling one first.
func goroutines() []goroutine {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var gs []goroutine
	for _, block := range bytes.Split(buf, []byte("\n\n")) {
		stack := strings.TrimSpace(string(block))
		header, _, _ := strings.Cut(stack, "\n")
		id, _, ok := strings.Cut(header, " [")
		if !ok || !strings.HasPrefix(id, "goroutine ") {
			continue
		}
		gs = append(gs, goroutine{id: id, top: topFunction(stack), stack: stack})
	}
	return gs
}

// topFunction describes a goroutine by the function it runs (its
// outermost frame) and the function that started it.
func topFunction(stack string) string {
	var entry, creator string
	for _, l := range strings.Split(stack, "\n")[1:] {
		switch {
		case strings.HasPrefix(l, "\t"):
		case strings.HasPrefix(l, "created by "):
			creator, _, _ = strings.Cut(strings.TrimPrefix(l, "created by "), " in goroutine")
		default:
			entry = l
			if i := strings.LastIndexByte(entry, '('); i > 0 {
				entry = entry[:i]
			}
		}
	}
	if creator != "" {
		return entry + " (created by " + creator + ")"
	}
	return entry
}

// VerifyTestMain runs a package's tests and exits non-zero if goroutines
// started during them are still running about 5 s after the last one ended.
// Call it from TestMain:
//
//	func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }
func VerifyTestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	deadline := time.Now().Add(goroutineWait)
	for code == 0 && runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "FAIL: %d goroutines left running, %d before the tests:\n", runtime.NumGoroutine(), before)
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			code = 1
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	os.Exit(code)
}
