package safety

import (
	"context"
	"flag"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/leakcheck"
)

// parallel is how many of the package's parallel tests (the scenarios
// under faults, TestHolderPause) run at once, unless go test -parallel
// says otherwise: each starts its own servers and mostly waits on TTLs and
// faults (the whole package used 39 s of CPU in 267 s, measured), so more
// than GOMAXPROCS (the default, 2 on CI) at once.
const parallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(parallel)); err != nil {
			panic(err)
		}
	}
	leakcheck.VerifyTestMain(m)
}

// duration is how long each scenario runs: short in the README's test
// command, longer with HOLDFAST_SAFETY_DURATION (a Go duration).
func duration(t *testing.T) time.Duration {
	if s := os.Getenv("HOLDFAST_SAFETY_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("HOLDFAST_SAFETY_DURATION=%q: %v", s, err)
		}
		return d
	}
	return 20 * time.Second
}

func check(t *testing.T, s Summary, err error) {
	t.Helper()
	t.Logf("\n%s", s)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range s.FenceViolations {
		t.Errorf("fence: %s", v)
	}
	for _, v := range s.Witnesses {
		t.Errorf("not linearizable: %s", v)
	}
	for _, v := range s.ToldFirstViolations {
		t.Errorf("told first: %s", v)
	}
	for _, v := range s.ReleaseViolations {
		t.Errorf("release: %s", v)
	}
	for _, v := range s.Liveness.Violations {
		t.Errorf("liveness: %s", v)
	}
	if !s.OK() {
		t.Errorf("checkers failed: linearizable=%v keys left=%v grants=%d", s.Linearizable, s.LeftKeys, s.Grants)
	}
}

// The scenarios below run in parallel with each other and with
// TestHolderPause (see parallel).

// TestEtcdMutexUnderFaults runs the etcd scenario (see RunEtcd).
func TestEtcdMutexUnderFaults(t *testing.T) {
	t.Parallel()
	s, err := RunEtcd(context.Background(), EtcdOptions{Duration: duration(t), Log: testLog{t}})
	check(t, s, err)
}

// TestConsulMutexUnderFaults runs the Consul scenario (see RunConsul), for
// twice the etcd scenario's time: a holder cut off keeps the lock for up to
// twice the 10 s TTL (Consul's grace), so grants are fewer.
func TestConsulMutexUnderFaults(t *testing.T) {
	t.Parallel()
	s, err := RunConsul(context.Background(), ConsulOptions{Duration: 2 * duration(t), Log: testLog{t}})
	check(t, s, err)
}

// testLog writes to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

// TestEtcdSemaphoreUnderFaults and the others run the scenarios with the
// other primitives: a semaphore of limit SemaphoreLimit (at most that many
// live grants), and an election (one live leader).
func TestEtcdSemaphoreUnderFaults(t *testing.T) {
	t.Parallel()
	s, err := RunEtcd(context.Background(), EtcdOptions{Duration: duration(t), Primitive: Semaphore, Log: testLog{t}})
	check(t, s, err)
}

func TestEtcdElectionUnderFaults(t *testing.T) {
	t.Parallel()
	s, err := RunEtcd(context.Background(), EtcdOptions{Duration: duration(t), Primitive: Elect, Log: testLog{t}})
	check(t, s, err)
}

func TestConsulSemaphoreUnderFaults(t *testing.T) {
	t.Parallel()
	s, err := RunConsul(context.Background(), ConsulOptions{Duration: 2 * duration(t), Primitive: Semaphore, Log: testLog{t}})
	check(t, s, err)
}

func TestConsulElectionUnderFaults(t *testing.T) {
	t.Parallel()
	s, err := RunConsul(context.Background(), ConsulOptions{Duration: 2 * duration(t), Primitive: Elect, Log: testLog{t}})
	check(t, s, err)
}
