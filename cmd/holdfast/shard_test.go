package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cmd/holdfast/internal/bench"
	"github.com/holdfast/holdfast/embedtest"
	"github.com/holdfast/holdfast/embedtest/etcdtest"
)

// shardEvent is a line of the CMDs' shared log.
type shardEvent struct {
	start         bool
	shard         int
	token         int64
	holdfast, pid int
	at            int64 // ns
}

func readShardLog(t *testing.T, path string) []shardEvent {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []shardEvent
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 6 {
			continue
		}
		var ev shardEvent
		ev.start = f[0] == "start"
		ev.shard, _ = strconv.Atoi(f[1])
		ev.token, _ = strconv.ParseInt(f[2], 10, 64)
		ev.holdfast, _ = strconv.Atoi(f[3])
		ev.pid, _ = strconv.Atoi(f[4])
		ev.at, _ = strconv.ParseInt(f[5], 10, 64)
		out = append(out, ev)
	}
	return out
}

// runningShards returns, per shard, the last start not followed by its
// stop (nil if none), from the log.
func runningShards(evs []shardEvent, n int) []*shardEvent {
	cur := make([]*shardEvent, n)
	for i := range evs {
		ev := &evs[i]
		if ev.start {
			cur[ev.shard] = ev
		} else if c := cur[ev.shard]; c != nil && c.pid == ev.pid {
			cur[ev.shard] = nil
		}
	}
	return cur
}

// TestShardCommand: three `holdfast shard --shards 12` processes run each
// shard's CMD in one process at a time (a CMD starts only after the
// previous owner's CMD logged its stop, tokens increasing), 4 +/- 1 per
// process; a kill -9 of one process stops its CMDs (the guard) and its
// shards' CMDs run again in the others within the TTL + 1 s; SIGTERM ends
// the others with status 0 after stopping their CMDs.
func TestShardCommand(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Etcd(t)
	shardCommandCase(t, []string{"--endpoints", etcd.Endpoints()[0]}, []string{"--ttl", "2s"}, 2*time.Second)
}

// TestShardCommandConsul: the same on Consul, where a killed process's
// session lasts up to 2 x TTL (20 s at the 10 s minimum) in the store, too
// long for the default test run: one process leaves by SIGTERM instead,
// and its shards' CMDs run in the others within 2 s (a graceful leave
// releases each shard as soon as its CMD has exited, and the new owner is
// already waiting for it: measured 194 ms, most of it starting the CMDs).
func TestShardCommandConsul(t *testing.T) {
	t.Parallel()
	a := embedtest.Consul(t)
	shardCommandCase(t, []string{"--backend", "consul", "--addr", a.HTTPAddr}, []string{"--ttl", "10s", "--lock-delay", "0s"}, 0)
}

// shardCommandCase runs TestShardCommand's steps with the store flags
// store and the session flags session; with ttl 0, one process leaves by
// SIGTERM instead of kill -9.
func shardCommandCase(t *testing.T, store, session []string, ttl time.Duration) {
	const n = 12
	logPath := filepath.Join(t.TempDir(), "log")
	script := `ev() { echo "$1 $HOLDFAST_SHARD $HOLDFAST_TOKEN $PPID $$ $(date +%s%N)" >> '` + logPath + `'; }; ev start; trap 'ev stop; exit 0' TERM; while :; do sleep 0.02; done`
	args := append(append([]string{"shard", "--shards", strconv.Itoa(n), "--kill-grace", "2s"}, append(store, session...)...), "shard-cmd/group", "--", "sh", "-c", script)
	var procs []*proc
	for range 3 {
		procs = append(procs, start(t, args...))
	}
	pids := map[int]bool{}
	for _, p := range procs {
		pids[p.cmd.Process.Pid] = true
	}
	balanced := func(live map[int]bool) bool {
		cur := runningShards(readShardLog(t, logPath), n)
		per := map[int]int{}
		for _, c := range cur {
			if c == nil || !live[c.holdfast] {
				return false
			}
			per[c.holdfast]++
		}
		for p := range live {
			if m := n / len(live); per[p] < m-1 || per[p] > m+1 {
				return false
			}
		}
		return true
	}
	eventually(t, 30*time.Second, "the 12 shards did not run balanced over 3 processes", func() bool { return balanced(pids) })

	// status GROUP shows the members and each shard's owner and token.
	st := start(t, append(append([]string{"status", "--json"}, store...), "shard-cmd/group")...)
	if code := st.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("status: exit %d: %s", code, st.stderr.String())
	}
	var view shardGroupView
	if err := json.Unmarshal(st.stdout.Bytes(), &view); err != nil {
		t.Fatalf("status --json: %v: %s", err, st.stdout.String())
	}
	owners := map[string]int{}
	for _, s := range view.Shards {
		if s.Owner == "" || s.Token == 0 {
			t.Errorf("status: shard %s has no owner: %+v", s.Shard, s)
		}
		owners[s.Owner]++
	}
	if view.Kind != "shard group" || len(view.Members) != 3 || len(view.Shards) != n || len(owners) != 3 {
		t.Errorf("status: %d members, %d shards, %d owners, want 3, %d, 3: %s", len(view.Members), len(view.Shards), len(owners), n, st.stdout.String())
	}
	for _, m := range view.Members {
		if owners[m.ID] != m.Shards {
			t.Errorf("status: member %s owns %d shards, says %d", m.ID, owners[m.ID], m.Shards)
		}
	}
	text := start(t, append(append([]string{"status"}, store...), "shard-cmd/group")...)
	text.wait(t, 10*time.Second)
	t.Logf("holdfast status shard-cmd/group:\n%s", text.stdout.String())

	// kill -9 one process (or SIGTERM, ttl 0).
	victim := procs[0]
	vpid := victim.cmd.Process.Pid
	var vcmds []int
	for _, c := range runningShards(readShardLog(t, logPath), n) {
		if c.holdfast == vpid {
			vcmds = append(vcmds, c.pid)
		}
	}
	sig, bound := syscall.SIGKILL, ttl+2*time.Second // the bound, TTL + 1 s, and 1 s more for a loaded machine (-race, 2 cores)
	if ttl == 0 {
		sig, bound = syscall.SIGTERM, 2*time.Second // a graceful leave: milliseconds, plus starting the CMDs on a loaded machine
	}
	killed := time.Now()
	if err := victim.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	victim.wait(t, 5*time.Second)
	delete(pids, vpid)
	eventually(t, ttl+5*time.Second, "the stopped process's shards did not run again elsewhere", func() bool { return balanced(pids) })
	took := time.Since(killed)
	t.Logf("%v: its %d shards run again elsewhere after %v (bound %v)", sig, len(vcmds), took.Round(time.Millisecond), bound)
	for _, pid := range vcmds {
		if running(pid) {
			t.Errorf("the stopped holdfast's CMD %d still runs after its shard moved", pid)
		}
	}
	if took > bound {
		t.Errorf("shards owned again after %v, want within %v", took, bound)
	}

	for _, p := range procs[1:] {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range procs[1:] {
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Errorf("holdfast shard after SIGTERM: exit %d, stderr:\n%s", code, p.stderr.String())
		}
	}

	// One CMD per shard at a time: each start comes after the stop of the
	// shard's previous CMD (or after the kill, for the killed process's
	// CMDs, which cannot log their stop), with a higher token.
	evs := readShardLog(t, logPath)
	last := make([]*shardEvent, n)
	for i := range evs {
		ev := &evs[i]
		prev := last[ev.shard]
		switch {
		case ev.start && prev != nil && prev.start && prev.holdfast != vpid:
			t.Errorf("shard %d: CMD %d (holdfast %d) started while CMD %d (holdfast %d) ran", ev.shard, ev.pid, ev.holdfast, prev.pid, prev.holdfast)
		case ev.start && prev != nil && prev.start && ev.at < killed.UnixNano():
			t.Errorf("shard %d: CMD %d started before the kill of holdfast %d, whose CMD %d ran", ev.shard, ev.pid, vpid, prev.pid)
		case ev.start && prev != nil && ev.token <= prev.token:
			t.Errorf("shard %d: token %d after %d", ev.shard, ev.token, prev.token)
		}
		last[ev.shard] = ev
	}
	for i, ev := range last {
		if ev == nil || ev.start {
			t.Errorf("shard %d: no stop logged at the end (%+v)", i, ev)
		}
	}
}

// TestBenchHelpListsScenarios: holdfast bench --help names every scenario,
// shard among them, in the --scenario flag's help and in the list of
// scenarios.
func TestBenchHelpListsScenarios(t *testing.T) {
	var stdout, stderr bytes.Buffer
	run(context.Background(), &env{stdout: &stdout, stderr: &stderr}, []string{"bench", "--help"})
	out := stdout.String() + stderr.String()
	flagHelp := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "-scenario") {
			flagHelp = l
		}
	}
	if flagHelp == "" {
		t.Fatalf("no --scenario flag in:\n%s", out)
	}
	names := bench.ScenarioNames()
	if !slices.Contains(names, "shard") {
		t.Fatalf("scenarios %v: no shard", names)
	}
	for _, sc := range names {
		if !strings.Contains(out, "\n  "+sc+" ") {
			t.Errorf("bench --help lists no scenario %q", sc)
		}
	}
	// The flag's help is on the line after its name.
	i := strings.Index(out, flagHelp)
	help := out[i : i+len(flagHelp)+200]
	for _, sc := range names {
		if !strings.Contains(help, sc) {
			t.Errorf("--scenario's help names no %q: %s", sc, help)
		}
	}
}
