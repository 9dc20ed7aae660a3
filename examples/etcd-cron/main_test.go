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

// runCron runs the example in-process, bounded, and returns its output.
func runCron(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out, args)
	t.Logf("etcd-cron %s:\n%s", strings.Join(args, " "), out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return out.String()
}

var (
	ranRe     = regexp.MustCompile(`^tick (\d+): (worker-[123]) ran the job \(token (\d+)\)$`)
	skipRe    = regexp.MustCompile(`^tick (\d+): worker-[123] skipped \((claimed|claim lost during the job|claim lost before the record was written)\)$`)
	summaryRe = regexp.MustCompile(`^runs=(\d+) skipped=(\d+)$`)
)

type jobRun struct {
	tick   int
	worker string
	token  int64
}

// checkRuns checks the output of a run of ticks ticks: at most one run per
// tick, tokens strictly increasing above minToken, a summary that adds up to
// 3 workers x ticks attempts, one skip line per skip with -v (none without),
// and most ticks actually run. It returns the runs.
func checkRuns(t *testing.T, out string, ticks int, minToken int64, verbose bool) []jobRun {
	t.Helper()
	var runs []jobRun
	seen := map[int]bool{}
	nSkip, summaries := 0, 0
	var gotRuns, gotSkipped int
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		switch {
		case strings.HasPrefix(line, "no -endpoints: started an embedded etcd at "):
		case ranRe.MatchString(line):
			m := ranRe.FindStringSubmatch(line)
			tick, _ := strconv.Atoi(m[1])
			token, _ := strconv.ParseInt(m[3], 10, 64)
			if tick < 1 || tick > ticks {
				t.Errorf("tick %d out of range 1..%d: %q", tick, ticks, line)
			}
			if seen[tick] {
				t.Errorf("tick %d ran more than once: %q", tick, line)
			}
			seen[tick] = true
			if token <= minToken {
				t.Errorf("token %d not above the previous run's %d: %q", token, minToken, line)
			}
			if len(runs) > 0 && tick <= runs[len(runs)-1].tick {
				t.Errorf("tick %d ran after tick %d: %q", tick, runs[len(runs)-1].tick, line)
			}
			minToken = token
			runs = append(runs, jobRun{tick, m[2], token})
		case skipRe.MatchString(line):
			nSkip++
		case summaryRe.MatchString(line):
			m := summaryRe.FindStringSubmatch(line)
			gotRuns, _ = strconv.Atoi(m[1])
			gotSkipped, _ = strconv.Atoi(m[2])
			summaries++
		default:
			t.Errorf("unexpected line %q", line)
		}
	}
	if summaries != 1 {
		t.Fatalf("%d summary lines, want 1", summaries)
	}
	if gotRuns != len(runs) {
		t.Errorf("summary says runs=%d, %d run lines", gotRuns, len(runs))
	}
	if verbose && nSkip != gotSkipped || !verbose && nSkip != 0 {
		t.Errorf("%d skip lines, summary says skipped=%d (verbose %v)", nSkip, gotSkipped, verbose)
	}
	if gotRuns+gotSkipped != 3*ticks {
		t.Errorf("runs+skipped = %d, want 3 workers x %d ticks = %d", gotRuns+gotSkipped, ticks, 3*ticks)
	}
	// A tick is skipped by all only if the previous run still holds the lock
	// when every worker tries: possible on a loaded machine, but not often.
	if len(runs) < (ticks+1)/2 {
		t.Errorf("only %d of %d ticks ran", len(runs), ticks)
	}
	return runs
}

func TestEmbedded(t *testing.T) {
	out := runCron(t, "-ticks", "10")
	if !strings.HasPrefix(out, "no -endpoints: started an embedded etcd at http://127.0.0.1:") {
		t.Errorf("output does not start by saying it started an embedded etcd")
	}
	checkRuns(t, out, 10, 0, false)
}

// TestInstantJob makes the job instant, so the winner releases its claim
// before the workers that wake up later try the same tick: the claim stays
// taken -at-least (40 ms, more than the 30 ms jitter), so they are refused
// and do not run the job a second time.
func TestInstantJob(t *testing.T) {
	out := runCron(t, "-ticks", "20", "-every", "80ms", "-job", "0", "-jitter", "30ms", "-v")
	checkRuns(t, out, 20, 0, true)
	if n := strings.Count(out, "(claimed)"); n == 0 {
		t.Errorf("no worker was refused a claimed tick: the test did not test that")
	}
}

// TestBadSchedule: a jitter the claim cannot absorb is refused.
func TestBadSchedule(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, []string{"-every", "50ms", "-jitter", "30ms"}); err == nil || !strings.Contains(err.Error(), "-jitter") {
		t.Errorf("-every 50ms -jitter 30ms (at-least 25ms): %v, want an error about -jitter", err)
	}
}

// TestEndpoints runs the example twice against one etcd, verbosely, and
// checks the record it leaves in etcd.
func TestEndpoints(t *testing.T) {
	cluster := etcdtest.Etcd(t)
	eps := strings.Join(cluster.Endpoints(), ",")
	cli := cluster.Client(t)

	var last int64
	for i := range 2 {
		out := runCron(t, "-endpoints", eps, "-ticks", "5", "-every", "80ms", "-v")
		if strings.Contains(out, "embedded") {
			t.Errorf("run %d started an embedded etcd despite -endpoints", i+1)
		}
		// A second run's tokens continue above the first's: they are etcd revisions.
		runs := checkRuns(t, out, 5, last, true)
		if len(runs) == 0 {
			t.FailNow()
		}
		r := runs[len(runs)-1]
		last = r.token

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cli.Get(ctx, lastRunKey)
		cancel()
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("get %s: %v, %d keys", lastRunKey, err, len(resp.Kvs))
		}
		want := regexp.MustCompile(`^at=\d+ tick=` + strconv.Itoa(r.tick) + ` worker=` + r.worker + ` token=` + strconv.FormatInt(r.token, 10) + `$`)
		if got := string(resp.Kvs[0].Value); !want.MatchString(got) {
			t.Errorf("run %d: record %q, want the last run %+v", i+1, got, r)
		}
		// The last run's mark ends with its Unlock: nothing is left
		// behind but the record of the last tick claimed.
		deadline := time.Now().Add(5 * time.Second)
		for {
			ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
			left, err := cli.Get(ctx, claimName+"/", clientv3.WithPrefix())
			cancel()
			if err == nil && len(left.Kvs) == 1 && string(left.Kvs[0].Key) == claimName+"/.claim" && left.Kvs[0].Lease == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("run %d: claim keys left: %v, %v; want the record alone", i+1, err, left.Kvs)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
