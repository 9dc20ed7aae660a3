package safety

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Fault is one injected fault, on the history's clock: from Start (when it
// was injected) to End (when it was mended). EndsSessions says whether it
// can end a session (or make its holder give its grant up before the store
// frees it): a partition or a pause of a client, a member or server
// stopped, frozen or cut off, a session destroyed or a holder's key
// deleted. Only deleting a waiter's key cannot.
type Fault struct {
	Kind         string
	Start, End   time.Duration
	EndsSessions bool
}

// LivenessBounds are what the liveness checker allows. An interval in
// which the lock was free while a live contender waited may last Base
// (1 s) when no fault is near it. Near a fault that can end a session it
// may last the part of the interval the fault was still in force (the
// store or the parties cut off), plus Expiry (how long the store takes to
// end a session nobody renews: etcd the TTL; Consul up to twice the TTL),
// plus LockDelay (Consul's, after an invalidated session), plus Base. An
// interval is near a fault if it starts before the fault's End plus that
// allowance; near a fault that cannot end a session, the allowance is the
// fault's part plus Base.
type LivenessBounds struct {
	Base, Expiry, LockDelay time.Duration
}

// WaitGap is one interval in which fewer grants than the limit were live
// while at least one client waited in Lock (the lock free while a live
// contender waited), with the fault it is attributed to (the nearest one;
// "" if the run had none) and the bound it was held to.
type WaitGap struct {
	From, To time.Duration
	Fault    string
	Bound    time.Duration
}

// Len is the gap's length.
func (g WaitGap) Len() time.Duration { return g.To - g.From }

func (g WaitGap) String() string {
	return fmt.Sprintf("free while a contender waited for %v (from %v to %v; %s)",
		g.Len().Round(time.Millisecond), g.From.Round(time.Millisecond), g.To.Round(time.Millisecond), g.near())
}

// BySum formats ByFault, largest first.
func (l Liveness) BySum() string {
	kinds := make([]string, 0, len(l.ByFault))
	for k := range l.ByFault {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return l.ByFault[kinds[i]] > l.ByFault[kinds[j]] })
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %v", k, l.ByFault[k].Round(time.Millisecond))
	}
	return strings.Join(parts, ", ")
}

// near names the gap's nearest fault and its bound.
func (g WaitGap) near() string {
	if g.Fault == "" {
		return fmt.Sprintf("no fault, bound %v", g.Bound)
	}
	return fmt.Sprintf("nearest fault %s, bound %v", g.Fault, g.Bound.Round(time.Millisecond))
}

// Liveness is the liveness checker's verdict on one run.
type Liveness struct {
	Longest WaitGap       // the longest gap (zero if none)
	Sum     time.Duration // the gaps' total length
	// ByFault is the sum per nearest fault's kind ("none" for the gaps of
	// a run without faults).
	ByFault    map[string]time.Duration
	Gaps       int
	Violations []WaitGap // the gaps longer than their bound
}

// CheckLiveness finds, in ops, every interval in which fewer than limit
// grants were live while at least one client was waiting in Lock, and
// judges each against its bound (see LivenessBounds), given the faults
// injected. A client waits from the call of an acquisition to its return; a
// grant is live from its acquisition's return until the earlier of the
// call of its release and the end of its context (an End op). The view is
// the clients': a grant whose holder was told of its loss is no longer
// live, even if the store has not freed its key yet, which is what the
// bounds near a fault allow for; a key that the store keeps for no live
// grant (a stranded entry, a phantom holder) is free.
func CheckLiveness(ops []Op, limit int, faults []Fault, b LivenessBounds) Liveness {
	type edge struct {
		at            time.Duration
		waits, grants int
	}
	var edges []edge
	type grantKey struct {
		client int
		token  int64
	}
	open := map[grantKey]time.Duration{} // grant -> when it became live
	var end time.Duration                // the history's last instant
	closeGrant := func(k grantKey, at time.Duration) {
		if from, ok := open[k]; ok {
			delete(open, k)
			edges = append(edges, edge{at: max(at, from), grants: -1})
		}
	}
	for _, op := range sortedByCall(ops) {
		end = max(end, op.Return, op.Call)
		k := grantKey{op.Client, int64(op.Token)}
		switch op.Kind {
		case Acquire:
			edges = append(edges, edge{at: op.Call, waits: 1}, edge{at: op.Return, waits: -1})
			if op.OK {
				open[k] = op.Return
				edges = append(edges, edge{at: op.Return, grants: 1})
			}
		case Want:
			edges = append(edges, edge{at: op.Call, waits: 1}, edge{at: op.Return, waits: -1})
		case Release:
			closeGrant(k, op.Call)
		case End:
			closeGrant(k, op.Call)
		}
	}
	for k := range open {
		closeGrant(k, end)
	}
	// At one instant, grants start before waits end (a grant's return ends
	// its wait at the same instant) and grants end after waits start: no
	// gap of zero length between them.
	sort.SliceStable(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].grants+edges[i].waits > edges[j].grants+edges[j].waits
	})
	var l Liveness
	waits, grants := 0, 0
	var from time.Duration
	inGap := false
	for _, e := range edges {
		waits += e.waits
		grants += e.grants
		gap := waits > 0 && grants < limit
		switch {
		case gap && !inGap:
			from, inGap = e.at, true
		case !gap && inGap:
			inGap = false
			if e.at > from {
				l.add(judge(from, e.at, faults, b))
			}
		}
	}
	return l
}

func (l *Liveness) add(g WaitGap) {
	l.Gaps++
	l.Sum += g.Len()
	if l.ByFault == nil {
		l.ByFault = map[string]time.Duration{}
	}
	kind := g.Fault
	if kind == "" {
		kind = "none"
	}
	l.ByFault[kind] += g.Len()
	if g.Len() > l.Longest.Len() {
		l.Longest = g
	}
	if g.Len() > g.Bound {
		l.Violations = append(l.Violations, g)
	}
}

// judge attributes the gap [from, to) to its nearest fault and sets its
// bound.
func judge(from, to time.Duration, faults []Fault, b LivenessBounds) WaitGap {
	g := WaitGap{From: from, To: to, Bound: b.Base}
	var nearest time.Duration = -1
	for _, f := range faults {
		d := time.Duration(0) // distance between the gap and the fault
		switch {
		case f.End < from:
			d = from - f.End
		case f.Start > to:
			d = f.Start - to
		}
		if nearest < 0 || d < nearest {
			nearest, g.Fault = d, f.Kind
		}
		if f.Start > to {
			continue // after the gap: it did not cause it
		}
		allow := b.Base
		if f.EndsSessions {
			allow += b.Expiry + b.LockDelay
		}
		if from > f.End+allow {
			continue // the gap began after the fault's allowance
		}
		inForce := max(min(to, f.End)-from, 0)
		g.Bound = max(g.Bound, inForce+allow)
	}
	return g
}

// sortedByCall returns ops sorted by call time.
func sortedByCall(ops []Op) []Op {
	s := append([]Op(nil), ops...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].Call < s[j].Call })
	return s
}
