package safety

import (
	"github.com/holdfast/holdfast"

	"testing"
	"time"
)

const ms = time.Millisecond

var bounds = LivenessBounds{Base: time.Second, Expiry: 2 * time.Second}

// grant is client c's acquisition of token t, called at call, granted at
// got, released at rel.
func grant(c int, t uint64, call, got, rel time.Duration) []Op {
	return []Op{
		{Client: c, Kind: Acquire, Token: holdfast.Token(t), OK: true, Call: call, Return: got},
		{Client: c, Kind: Release, Token: holdfast.Token(t), OK: true, Call: rel, Return: rel + ms},
	}
}

// TestLivenessFreeWhileWaiting: client 1 waits from 100 ms to 3 s while
// client 0's grant ended (released) at 500 ms: a gap of 2.5 s, over the
// 1 s bound with no fault, and within it when a session-ending fault was
// injected just before.
func TestLivenessFreeWhileWaiting(t *testing.T) {
	ops := append(grant(0, 1, 0, 10*ms, 500*ms), grant(1, 2, 100*ms, 3000*ms, 3100*ms)...)
	l := CheckLiveness(ops, 1, nil, bounds)
	// Client 0's own Lock round trip (10 ms) is a gap too.
	if l.Gaps != 2 || l.Longest.Len() != 2500*ms || l.Sum != 2510*ms || len(l.Violations) != 1 {
		t.Fatalf("got %+v, want gaps of 10 ms and 2.5 s, the second over its bound", l)
	}
	if l.Longest.From != 500*ms || l.Longest.Fault != "" || l.Longest.Bound != time.Second {
		t.Errorf("gap %v: want from 500ms, no fault, bound 1s", l.Longest)
	}
	// A pause of a client from 400 to 600 ms: 0.1 s in force + TTL 2 s +
	// 1 s allowed.
	l = CheckLiveness(ops, 1, []Fault{{Kind: "pause-client", Start: 400 * ms, End: 600 * ms, EndsSessions: true}}, bounds)
	if len(l.Violations) != 0 || l.Longest.Fault != "pause-client" || l.Longest.Bound != 3100*ms {
		t.Errorf("with a fault: %+v, want no violation, bound 3.1 s, attributed to pause-client", l)
	}
	if l.ByFault["pause-client"] != 2510*ms || l.BySum() != "pause-client 2.51s" {
		t.Errorf("by fault: %v (%s), want pause-client 2.51 s (both gaps are nearest to it)", l.ByFault, l.BySum())
	}
	// A fault that cannot end a session allows only its part + 1 s.
	l = CheckLiveness(ops, 1, []Fault{{Kind: "delete-waiter-key", Start: 400 * ms, End: 450 * ms}}, bounds)
	if len(l.Violations) != 1 {
		t.Errorf("near delete-waiter-key: %+v, want a violation", l)
	}
	// The grant lost (its context ended) at 200 ms, released at 500 ms:
	// free from 200 ms.
	lost := append(ops, Op{Client: 0, Kind: End, Token: 1, Call: 200 * ms, Return: 200 * ms})
	if l := CheckLiveness(lost, 1, nil, bounds); l.Longest.From != 200*ms || l.Longest.Len() != 2800*ms {
		t.Errorf("lost grant: %v, want from 200ms, 2.8 s", l.Longest)
	}
}

// TestLivenessNobodyWaits: the lock free for seconds with nobody waiting,
// and handoffs where the next grant follows the release within
// milliseconds, are no violation.
func TestLivenessNobodyWaits(t *testing.T) {
	ops := append(grant(0, 1, 0, 10*ms, 500*ms), grant(1, 2, 5000*ms, 5010*ms, 6000*ms)...)
	ops = append(ops, grant(2, 3, 5500*ms, 6003*ms, 7000*ms)...) // waits behind client 1
	l := CheckLiveness(ops, 1, nil, bounds)
	if len(l.Violations) != 0 || l.Longest.Len() > 10*ms || l.Gaps != 3 {
		t.Fatalf("got %+v, want three short gaps (the 10 ms of the uncontended Locks, the 3 ms handoff), no violation", l)
	}
	// A semaphore of limit 2: one grant live and a waiter is a gap; two
	// live grants and a waiter is not.
	sem := append(grant(0, 1, 0, 10*ms, 2000*ms), grant(1, 2, 0, 20*ms, 2000*ms)...)
	sem = append(sem, grant(2, 3, 30*ms, 2005*ms, 2100*ms)...)
	if l := CheckLiveness(sem, 2, nil, bounds); len(l.Violations) != 0 || l.Longest.Len() > 20*ms {
		t.Errorf("semaphore, both permits held: %+v, want no long gap", l)
	}
	if l := CheckLiveness(sem, 3, nil, bounds); len(l.Violations) != 1 {
		t.Errorf("limit 3, a permit free while client 2 waits: %+v, want a violation", l)
	}
}
