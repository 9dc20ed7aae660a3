package bench

import (
	"math"
	"slices"
	"time"
)

// Result is one row: one implementation, one setting. It is printed as one
// JSON object per line. Fields that do not apply to a row are null.
type Result struct {
	Scenario   string `json:"scenario"`
	Backend    string `json:"backend"`
	Impl       string `json:"impl"`
	Contenders int    `json:"contenders"`
	// Nodes is the number of store members (etcd: the embedded cluster's
	// size or the endpoints given; Consul: 1 for the dev agent). Omitted
	// when unknown.
	Nodes int `json:"nodes,omitempty"`
	// Rounds is the number of alternation rounds the row's window was
	// split into (contended rows).
	Rounds int `json:"rounds,omitempty"`
	// Waiters is the waiters scenario's number of waiters (the row has
	// waiters+1 contenders: one holds while the others wait).
	Waiters *int `json:"waiters,omitempty"`
	// Limit is the semaphore scenario's limit (how many may hold at once).
	Limit  *int    `json:"limit,omitempty"`
	HoldMS float64 `json:"hold_ms"`
	// DurationS is the measured window (contended rows) or the wall time of
	// all repeats (takeover rows), in seconds.
	DurationS    float64 `json:"duration_s"`
	Acquisitions int     `json:"acquisitions"`
	AcqPerS      float64 `json:"acq_per_s"`
	Handoffs     int     `json:"handoffs"`
	HandoffsPerS float64 `json:"handoffs_per_s"`
	// HandoffP50MS and HandoffP99MS: previous holder's Unlock call to this
	// holder's Lock return, over acquisitions where the holder changed.
	HandoffP50MS *float64 `json:"handoff_p50_ms"`
	HandoffP99MS *float64 `json:"handoff_p99_ms"`
	// WaitP50MS and WaitP99MS: Lock call to Lock return.
	WaitP50MS *float64 `json:"wait_p50_ms"`
	WaitP99MS *float64 `json:"wait_p99_ms"`
	// CycleP50MS: Lock call to Unlock return, on rows with one contender.
	CycleP50MS *float64 `json:"cycle_p50_ms"`
	// Fairness is Jain's index over per-contender acquisition counts.
	Fairness *float64 `json:"fairness"`
	// RPCs is the number of store requests (see RPCUnit) in the window.
	RPCs       int64    `json:"rpcs"`
	RPCsPerAcq *float64 `json:"rpcs_per_acq"`
	RPCUnit    string   `json:"rpc_unit"`
	// BytesPerAcq: bytes received by all contenders in the window (see
	// Counter.Bytes for what each store counts), per acquisition.
	BytesPerAcq *float64 `json:"bytes_per_acq"`
	// OfFloor is this row's acq_per_s divided by the floor row's of the
	// same setting (null on the floor row itself and where there is no
	// floor).
	OfFloor *float64 `json:"of_floor"`
	// StreamsPerAcq (etcd only): gRPC streams opened (watches, keepalives)
	// per acquisition; not included in rpcs_per_acq.
	StreamsPerAcq *float64 `json:"streams_per_acq,omitempty"`
	Violations    int      `json:"violations"`
	Errors        int      `json:"errors"`
	// Takeover rows.
	LockDelayMS *float64  `json:"lock_delay_ms"`
	TakeoverMS  *float64  `json:"takeover_ms"`
	TakeoverAll []float64 `json:"takeover_all_ms,omitempty"`
	NoticeMS    *float64  `json:"notice_ms"`
	Repeats     int       `json:"repeats,omitempty"`
	// Election rows (see ScenarioElection).
	FailoverMS  *float64  `json:"failover_ms,omitempty"`
	FailoverAll []float64 `json:"failover_all_ms,omitempty"`
	ObserveMS   *float64  `json:"observe_ms,omitempty"`

	TTLS       float64 `json:"ttl_s"`
	Note       string  `json:"note,omitempty"`
	FirstError string  `json:"first_error,omitempty"`
}

// Ratio compares the holdfast row with the native row of one setting:
// every field is holdfast's value divided by native's (null when either is
// missing or native's is 0). Printed as {"ratio": {...}}.
type Ratio struct {
	Scenario    string   `json:"scenario"`
	Backend     string   `json:"backend"`
	Contenders  int      `json:"contenders"`
	HoldMS      float64  `json:"hold_ms"`
	LockDelayMS *float64 `json:"lock_delay_ms,omitempty"`
	Limit       *int     `json:"limit,omitempty"`
	Nodes       int      `json:"nodes,omitempty"`
	Of          string   `json:"of"`
	AcqPerS     *float64 `json:"acq_per_s"`
	HandoffsPS  *float64 `json:"handoffs_per_s"`
	HandoffP50  *float64 `json:"handoff_p50"`
	CycleP50    *float64 `json:"cycle_p50"`
	RPCsPerAcq  *float64 `json:"rpcs_per_acq"`
	Fairness    *float64 `json:"fairness"`
	TakeoverMS  *float64 `json:"takeover_ms,omitempty"`
	FailoverMS  *float64 `json:"failover_ms,omitempty"`
	ObserveMS   *float64 `json:"observe_ms,omitempty"`
	// HoldfastOfFloor and NativeOfFloor are the two rows' of_floor.
	HoldfastOfFloor *float64 `json:"holdfast_of_floor,omitempty"`
	NativeOfFloor   *float64 `json:"native_of_floor,omitempty"`
	// Notes explain ratios left null because native's value is 0.
	Notes []string `json:"notes,omitempty"`
}

// NewRatio returns h / n field by field.
func NewRatio(h, n Result) Ratio {
	q := Ratio{
		Scenario:        h.Scenario,
		Backend:         h.Backend,
		Contenders:      h.Contenders,
		HoldMS:          h.HoldMS,
		LockDelayMS:     h.LockDelayMS,
		Limit:           h.Limit,
		Nodes:           h.Nodes,
		HoldfastOfFloor: h.OfFloor,
		NativeOfFloor:   n.OfFloor,
		Of:              ImplHoldfast + "/" + ImplNative,
		CycleP50:        divp(h.CycleP50MS, n.CycleP50MS),
		RPCsPerAcq:      divp(h.RPCsPerAcq, n.RPCsPerAcq),
		HandoffP50:      divp(h.HandoffP50MS, n.HandoffP50MS),
		Fairness:        divp(h.Fairness, n.Fairness),
		TakeoverMS:      divp(h.TakeoverMS, n.TakeoverMS),
		FailoverMS:      divp(h.FailoverMS, n.FailoverMS),
		ObserveMS:       divp(h.ObserveMS, n.ObserveMS),
	}
	if h.Scenario != ScenarioTakeover && h.Scenario != ScenarioElection {
		q.AcqPerS = div(h.AcqPerS, n.AcqPerS)
		q.HandoffsPS = div(h.HandoffsPerS, n.HandoffsPerS)
		if n.HandoffsPerS == 0 && h.HandoffsPerS > 0 {
			q.Notes = append(q.Notes, "native handoffs_per_s is 0: every acquisition went to the contender that had just released")
		}
	}
	return q
}

func div(a, b float64) *float64 {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return nil
	}
	return num(a / b)
}

func divp(a, b *float64) *float64 {
	if a == nil || b == nil {
		return nil
	}
	return div(*a, *b)
}

// num rounds to 3 significant decimals and returns a pointer for a nullable
// field.
func num(x float64) *float64 {
	r := round(x)
	return &r
}

func round(x float64) float64 {
	switch ax := math.Abs(x); {
	case ax == 0 || math.IsNaN(x) || math.IsInf(x, 0):
		return x
	case ax >= 100:
		return math.Round(x*10) / 10
	default:
		return math.Round(x*1000) / 1000
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile returns the p-quantile (0 < p <= 1) of ds by nearest rank, in
// milliseconds, or nil if ds is empty. ds is sorted in place.
func percentile(ds []time.Duration, p float64) *float64 {
	if len(ds) == 0 {
		return nil
	}
	slices.Sort(ds)
	i := int(math.Ceil(p*float64(len(ds)))) - 1
	i = max(0, min(i, len(ds)-1))
	return num(ms(ds[i]))
}

// jain returns Jain's fairness index of xs, or nil if they sum to 0.
func jain(xs []int) *float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	if sum == 0 {
		return nil
	}
	return num(sum * sum / (float64(len(xs)) * sq))
}
