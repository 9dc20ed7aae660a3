package conformance_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/conformance"
	"github.com/holdfast/holdfast/embedtest/leakcheck"
)

const (
	// lossNotice and opTimeout are the fake's bounds: it notices a killed
	// session at once, so these only bound how long a broken fake stalls.
	lossNotice = time.Second
	opTimeout  = 10 * time.Second

	// bugEnv selects the bug of the fake that TestBrokenFakeHelper runs the
	// suite against, in a child process.
	bugEnv = "HOLDFAST_CONFORMANCE_FAKE_BUG"
	helper = "TestBrokenFakeHelper"

	// childProcs is how many child processes TestSuiteCatchesBrokenFakes
	// runs at once.
	childProcs = 4
)

// TestFake runs the suite against the correct fake: every subtest passes
// and no goroutine is left behind.
func TestFake(t *testing.T) {
	leakcheck.Check(t)
	conformance.Run(t, newFakeStore("").backend())
}

// TestBrokenFakeHelper runs the suite against a broken fake. It does
// something only in the child processes of TestSuiteCatchesBrokenFakes,
// which expect it to fail.
func TestBrokenFakeHelper(t *testing.T) {
	bug := os.Getenv(bugEnv)
	if bug == "" {
		return // not a child process of TestSuiteCatchesBrokenFakes: nothing to do
	}
	leakcheck.Check(t)
	conformance.Run(t, newFakeStore(bug).backend())
}

// brokenFakes lists each bug with the subtests that must catch it
// ("CheckGoroutines" stands for the goroutine-leak check). A child process
// runs those subtests (MonotonicTokens if none); with -conformance.full,
// the subtests of their families (see family), and of the lock family if
// it has none: the bugs in semaphores, RW locks and elections do not make
// every lock property run again.
var brokenFakes = []struct {
	bug      string
	mustFail []string
}{
	{bugLIFO, []string{"FIFO", "MultiFIFO"}},
	{bugNoExclusion, []string{"MutualExclusion"}},
	{bugSessionToken, []string{"MutualExclusion", "LossNotice", "RWTokens", "ElectionOneLeader"}},
	{bugZeroToken, []string{"MonotonicTokens"}},
	{bugKeyOutside, []string{"MonotonicTokens"}},
	{bugTryLockBlocks, []string{"TryLock", "SemaphoreTryLock"}},
	{bugTryLockBarges, []string{"TryLock"}},
	{bugLeakyCancel, []string{"CancelCleanup", "SemaphoreCancelCleanup", "RWCancelCleanup", "ElectionLeader", "Liveness"}},
	{bugCancelledFreeLock, []string{"CancelCleanup"}},
	{bugReleaseCause, []string{"MonotonicTokens", "Reentrancy"}},
	{bugNoLossNotice, []string{"LossNotice"}},
	{bugLossCausePlain, []string{"LossNotice"}},
	{bugLateNotice, []string{"ToldBeforeNextGrant"}},
	{bugNoMargin, []string{"ToldBeforeNextGrant"}},
	{bugUnguardedUnlock, []string{"LossNotice", "DoubleUnlock", "Reentrancy"}},
	{bugLossCleanupUnguarded, []string{"DeletedKey"}},
	{bugStaleUnlockByName, []string{"DeletedKey"}},
	{bugReentrantIgnored, []string{"Reentrancy", "SemaphoreReentrancy"}},
	{bugWaiterIgnoresKill, []string{"ContextWhileWaiting"}},
	{bugGrantFromDeadSession, []string{"SessionClose"}},
	{bugCloseCause, []string{"SessionClose"}},
	{bugCtxBeforeSession, []string{"SessionClose"}},
	{bugLockIgnoresCtx, []string{"BoundedLock"}},
	{bugUnlockWaitsForStore, []string{"BoundedUnlock"}},
	{bugUnlockCancelLeaves, []string{"BoundedUnlock"}},
	{bugNestedIgnored, []string{"NestedNames"}},
	{bugNilContext, []string{"BadInput"}},
	{bugHerd, []string{"NoHerd"}},
	{bugLeakGoroutine, []string{"CheckGoroutines"}},

	{bugSemOverAdmit, []string{"SemaphoreLimit", "SemaphoreTryLock"}},
	{bugSemMismatchIgnored, []string{"SemaphoreLimitMismatch"}},
	{bugSemDeadHolderKept, []string{"SemaphoreKilledHolder"}},
	{bugLateAdmission, []string{"SemaphorePromptAdmission", "RWPromptAdmission"}},
	{bugDowngradeNewToken, []string{"RWDowngrade"}},
	{bugDowngradeKeepsWrite, []string{"RWDowngrade"}},
	{bugRWWriterBesideRead, []string{"RWExclusion", "RWReadersShare"}},
	{bugRWReaderBarges, []string{"RWWriterNotStarved"}},
	{bugRWReadersExclusive, []string{"RWReadersShare"}},
	{bugRWReentrantAccepted, []string{"RWReentrancy"}},
	{bugElectTwoLeaders, []string{"ElectionOneLeader"}},
	{bugElectTermsDecrease, []string{"ElectionOneLeader", "ElectionFailover"}},
	{bugElectToldLate, []string{"ElectionResign"}},
	{bugLeaderNoError, []string{"ElectionLeader"}},
	{bugObserveOutOfOrder, []string{"ElectionObserve"}},
	{bugObserveSkips, []string{"ElectionObserve"}},
	{bugObserveNoNone, []string{"ElectionObserve"}},
	{bugObserveGhost, []string{"ElectionObserveWinners"}},

	{bugClaimTwice, []string{"ClaimOnce", "ClaimTicks"}},
	{bugClaimQueues, []string{"ClaimOnce"}},
	{bugClaimNoAtLeast, []string{"ClaimOnce"}},
	{bugClaimToldLate, []string{"ClaimAtMost"}},
	{bugClaimStuck, []string{"ClaimAtMost", "ClaimTicks"}},
	{bugClaimForgets, []string{"ClaimOnce", "ClaimLate"}},
	{bugClaimPastPeriod, []string{"ClaimLate"}},

	{bugMultiNoOrder, []string{"MultiNoDeadlock"}},
	{bugMultiKeepsParts, []string{"MultiCancel"}},
	{bugMultiIgnoresParts, []string{"MultiLoss"}},
}

var subtestLine = regexp.MustCompile(`(?m)^\s*--- (PASS|FAIL|SKIP): ` + helper + `/(\S+) `)

// full makes TestSuiteCatchesBrokenFakes run every property of a bug's
// families against it (`make conformance-full`), not only those meant to
// catch it.
var full = flag.Bool("conformance.full", false, "TestSuiteCatchesBrokenFakes: run whole property families against each broken fake")

// TestSuiteCatchesBrokenFakes runs the suite against each broken fake in a
// child process (a failing subtest cannot be observed from inside the same
// test binary without failing it) and checks that the subtests meant to
// catch the bug fail, and that every subtest catches at least one bug. Each
// child runs only the subtests meant to catch its bug; with
// -conformance.full, every subtest of their families (of the lock family
// for a bug listed with none), and then every subtest must have run.
func TestSuiteCatchesBrokenFakes(t *testing.T) {
	if names := conformance.PropertyNames(); !slices.Equal(names, allSubtests) {
		t.Fatalf("allSubtests %q, want the suite's subtests in order: %q", allSubtests, names)
	}
	var (
		mu      sync.Mutex
		seen    = map[string]bool{}
		catches = map[string][]string{} // subtest -> bugs it caught
	)
	// The children wait on timers most of the time: they run childProcs at
	// once (more than -test.parallel's default, GOMAXPROCS), started here,
	// and each subtest checks its child's output.
	type child struct {
		out string
		err error
	}
	done := make([]chan child, len(brokenFakes))
	slots := make(chan struct{}, childProcs)
	for i, bf := range brokenFakes {
		done[i] = make(chan child, 1)
		go func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			run := "^" + helper + "$"
			families := map[string]bool{"Lock": true}
			if len(bf.mustFail) > 0 && bf.mustFail[0] != "CheckGoroutines" {
				families = map[string]bool{}
				for _, name := range bf.mustFail {
					families[family(name)] = true
				}
			}
			if *full {
				var targets []string
				for _, name := range allSubtests {
					if families[family(name)] {
						targets = append(targets, name)
					}
				}
				run += "/^(" + strings.Join(targets, "|") + ")$"
			} else {
				// Only the subtests meant to catch the bug.
				targets := slices.DeleteFunc(slices.Clone(bf.mustFail), func(s string) bool { return s == "CheckGoroutines" })
				if len(targets) == 0 {
					targets = []string{"MonotonicTokens"}
				}
				run += "/^(" + strings.Join(targets, "|") + ")$"
			}
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+run, "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), bugEnv+"="+bf.bug)
			out, err := cmd.CombinedOutput()
			done[i] <- child{string(out), err}
		}()
	}
	t.Run("bugs", func(t *testing.T) {
		for i, bf := range brokenFakes {
			t.Run(bf.bug, func(t *testing.T) {
				c := <-done[i]
				out, err := c.out, c.err
				if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) {
					t.Fatalf("child process with bug %s: %v, want it to exit with a failure\n%s", bf.bug, err, out)
				}
				if strings.Contains(out, "panic:") {
					t.Fatalf("child process with bug %s panicked:\n%s", bf.bug, out)
				}
				var failed, passed []string
				for _, m := range subtestLine.FindAllStringSubmatch(out, -1) {
					switch m[1] {
					case "FAIL":
						failed = append(failed, m[2])
					case "PASS":
						passed = append(passed, m[2])
					default:
						t.Errorf("subtest %s skipped", m[2])
					}
				}
				if strings.Contains(out, "goroutine leak:") {
					failed = append(failed, "CheckGoroutines")
				}
				t.Logf("bug %-22s caught by %v; passed: %v", bf.bug, failed, passed)
				for _, want := range bf.mustFail {
					if !slices.Contains(failed, want) {
						t.Errorf("bug %s: subtest %s passed, want it to fail\n%s", bf.bug, want, out)
					}
				}
				if bf.bug == bugLeakGoroutine && !strings.Contains(out, "(*fakeGrant).watch") {
					t.Errorf("bug %s: the leak report does not show the leaked goroutine's stack\n%s", bf.bug, out)
				}
				mu.Lock()
				defer mu.Unlock()
				for _, name := range append(failed, passed...) {
					if name != "CheckGoroutines" {
						seen[name] = true
					}
				}
				for _, name := range failed {
					catches[name] = append(catches[name], bf.bug)
				}
			})
		}
	})
	if t.Failed() {
		return
	}
	if *full {
		for _, name := range allSubtests {
			if !seen[name] {
				t.Errorf("subtest %s did not run in the children", name)
			}
		}
		for name := range seen {
			if !slices.Contains(allSubtests, name) {
				t.Errorf("subtest %s ran in the children but is not listed in allSubtests", name)
			}
		}
	}
	for _, name := range allSubtests {
		if len(catches[name]) == 0 {
			t.Errorf("subtest %s caught none of the bugs", name)
		}
	}
}

// family is the primitive a subtest is about: "Semaphore", "RW",
// "Election", or "Lock".
func family(subtest string) string {
	for _, f := range []string{"Semaphore", "RW", "Election", "Claim", "Multi"} {
		if strings.HasPrefix(subtest, f) {
			return f
		}
	}
	return "Lock"
}

// allSubtests are the subtests conformance.Run runs.
var allSubtests = []string{
	"MutualExclusion", "FIFO", "NoHerd", "TryLock", "CancelCleanup", "MonotonicTokens",
	"LossNotice", "ToldBeforeNextGrant", "DeletedKey", "SessionClose", "DoubleUnlock",
	"Reentrancy", "ContextWhileWaiting", "BoundedLock", "BoundedUnlock", "NestedNames", "Liveness", "BadInput",
	"SemaphoreLimit", "SemaphoreTryLock", "SemaphoreKilledHolder", "SemaphoreCancelCleanup", "SemaphoreLimitMismatch",
	"SemaphorePromptAdmission", "SemaphoreReentrancy",
	"RWExclusion", "RWReadersShare", "RWWriterNotStarved", "RWCancelCleanup", "RWTokens", "RWPromptAdmission", "RWDowngrade", "RWReentrancy",
	"ElectionOneLeader", "ElectionObserve", "ElectionObserveWinners", "ElectionLeader", "ElectionResign", "ElectionFailover",
	"ClaimOnce", "ClaimLate", "ClaimAtMost", "ClaimTicks",
	"MultiNoDeadlock", "MultiCancel", "MultiLoss", "MultiFIFO",
}
