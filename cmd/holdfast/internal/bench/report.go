package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes v as one line of JSON.
func WriteJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// WriteRatioJSON writes q as {"ratio": {...}} on one line.
func WriteRatioJSON(w io.Writer, q Ratio) error {
	return WriteJSON(w, struct {
		Ratio Ratio `json:"ratio"`
	}{q})
}

// WriteTable writes the results as an aligned table, followed by one ratio
// line per holdfast/native pair and the notes of takeover rows.
func WriteTable(w io.Writer, s Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tbackend\timpl\tnodes\tn\twaiters\thold_ms\tdelay_ms\tacq\tacq/s\tvs_native\tof_floor\thandoff/s\thandoff_p50\thandoff_p99\tcycle_p50\ttakeover\tnotice\tfairness\trpc/acq\tbytes/acq\tviol\terr\t")
	for _, r := range s.Results {
		vsNative := "-"
		if r.Impl == ImplHoldfast {
			if q := ratioFor(s.Ratios, r); q != nil {
				vsNative = fp(q.AcqPerS)
			}
		}
		if r.Scenario == ScenarioElection { // failover and observe in the takeover and notice columns
			r.TakeoverMS, r.NoticeMS = r.FailoverMS, r.ObserveMS
		}
		nodes := "-"
		if r.Nodes > 0 {
			nodes = fmt.Sprint(r.Nodes)
		}
		waiters := "-"
		if r.Waiters != nil {
			waiters = fmt.Sprint(*r.Waiters)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t\n",
			r.Scenario, r.Backend, r.Impl, nodes, r.Contenders, waiters, f(r.HoldMS), fp(r.LockDelayMS),
			r.Acquisitions, f(r.AcqPerS), vsNative, fp(r.OfFloor), f(r.HandoffsPerS), fp(r.HandoffP50MS), fp(r.HandoffP99MS),
			fp(r.CycleP50MS), fp(r.TakeoverMS), fp(r.NoticeMS), fp(r.Fairness), fp(r.RPCsPerAcq), fp(r.BytesPerAcq),
			r.Violations, r.Errors)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, spec := range registry {
		if spec.table == nil {
			continue
		}
		if err := spec.table(w, s.Other); err != nil {
			return err
		}
	}
	if len(s.Ratios) > 0 {
		fmt.Fprintln(w)
	}
	for _, q := range s.Ratios {
		fmt.Fprintln(w, RatioLine(q))
	}
	var noteOrder []string
	noteWho := map[string][]string{}
	for _, r := range s.Results {
		if r.Note != "" {
			if noteWho[r.Note] == nil {
				noteOrder = append(noteOrder, r.Note)
			}
			noteWho[r.Note] = append(noteWho[r.Note], r.Impl)
		}
		if r.FirstError != "" {
			fmt.Fprintf(w, "first error (%s %s %s n=%d): %s\n", r.Backend, r.Scenario, r.Impl, r.Contenders, r.FirstError)
		}
	}
	for _, n := range noteOrder {
		fmt.Fprintf(w, "note (%s): %s\n", strings.Join(slices.Compact(noteWho[n]), ", "), n)
	}
	fmt.Fprintln(w, "times in ms; handoff = previous holder's Unlock call -> next holder's Lock return; vs_native = holdfast acq/s / native acq/s;",
		"of_floor = acq/s / the floor row's acq/s (floor: a relay with no safety, the store's own limit); rpc/acq counts",
		strings.Join(units(s), ", ")+"; bytes/acq: bytes received (etcd: gRPC messages incl. watch events, headers; consul: response bodies)")
	return nil
}

// ratioFor returns the ratio of r's setting, if any.
func ratioFor(qs []Ratio, r Result) *Ratio {
	for i := range qs {
		q := &qs[i]
		if q.Scenario == r.Scenario && q.Backend == r.Backend && q.Contenders == r.Contenders && q.HoldMS == r.HoldMS &&
			q.Nodes == r.Nodes && eqp(q.LockDelayMS, r.LockDelayMS) && eqi(q.Limit, r.Limit) {
			return q
		}
	}
	return nil
}

func eqp(a, b *float64) bool { return (a == nil && b == nil) || (a != nil && b != nil && *a == *b) }
func eqi(a, b *int) bool     { return (a == nil && b == nil) || (a != nil && b != nil && *a == *b) }

func units(s Summary) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range s.Results {
		if u := r.Backend + ": " + r.RPCUnit; !seen[u] {
			seen[u] = true
			out = append(out, u)
		}
	}
	return out
}

// RatioLine formats q for humans.
func RatioLine(q Ratio) string {
	var b strings.Builder
	fmt.Fprintf(&b, "ratio holdfast/native %s %s n=%d hold=%sms", q.Backend, q.Scenario, q.Contenders, f(q.HoldMS))
	if q.LockDelayMS != nil && (q.Scenario == ScenarioTakeover || q.Scenario == ScenarioElection) {
		fmt.Fprintf(&b, " lock-delay=%sms", f(*q.LockDelayMS))
	}
	b.WriteString(":")
	add := func(name string, v *float64) {
		if v != nil {
			fmt.Fprintf(&b, "  %s %sx", name, f(*v))
		}
	}
	add("acq/s", q.AcqPerS)
	add("holdfast of_floor", q.HoldfastOfFloor)
	add("native of_floor", q.NativeOfFloor)
	add("handoffs/s", q.HandoffsPS)
	add("handoff_p50", q.HandoffP50)
	add("cycle_p50", q.CycleP50)
	add("takeover", q.TakeoverMS)
	add("failover", q.FailoverMS)
	add("observe", q.ObserveMS)
	add("rpcs/acq", q.RPCsPerAcq)
	add("fairness", q.Fairness)
	for _, n := range q.Notes {
		fmt.Fprintf(&b, "  (%s)", n)
	}
	return b.String()
}

func f(x float64) string {
	s := fmt.Sprintf("%.3f", x)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

func fp(x *float64) string {
	if x == nil {
		return "-"
	}
	return f(*x)
}
