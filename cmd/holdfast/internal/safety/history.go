package safety

import (
	"fmt"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/holdfast/holdfast"
)

// Kind is the kind of a recorded operation.
type Kind int

// Operation kinds.
const (
	Acquire Kind = iota // Lock; Token is the grant's, or the call failed
	Put                 // a fenced write with Token; OK is whether it was accepted
	Release             // Unlock of the grant with Token
	// End: the context of the grant with Token ended (released or lost),
	// at Call (= Return). Only the liveness checker reads it.
	End
	// Want: the client wanted a grant from Call to Return without calling
	// Lock itself (a shard group's member while it runs: the group locks
	// for it). Only the liveness checker reads it.
	Want
)

func (k Kind) String() string {
	return [...]string{"acquire", "put", "release", "end", "want"}[k]
}

// Op is one recorded operation: its invocation and its return.
type Op struct {
	Client       int
	Kind         Kind
	Token        holdfast.Token
	OK           bool // acquire: granted; write: accepted; release: nil error
	Call, Return time.Duration
}

// History records the operations of every client of a workload. It is safe
// for concurrent use.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewHistory returns an empty history whose clock starts now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the history's clock (monotonic).
func (h *History) Now() time.Duration { return time.Since(h.start) }

// Add records op.
func (h *History) Add(op Op) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Ops returns the recorded operations.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// mutexState is the state of the fenced-mutex model: the latest token
// granted and the highest token the resource accepted.
type mutexState struct{ granted, written holdfast.Token }

// fencedModel is FencedMutex, or with shared true FencedSemaphore.
func fencedModel(shared bool) porcupine.Model {
	m := FencedMutex
	if shared {
		m.Step = func(state, input, output any) (bool, any) {
			s, op := state.(mutexState), input.(Op)
			if op.Kind == Acquire && op.OK && op.Token == s.granted {
				return true, s // admitted by the same write as the previous grant
			}
			return FencedMutex.Step(state, input, output)
		}
	}
	return m
}

// FencedMutex is the porcupine model of a fenced mutex over one resource:
// grants carry strictly increasing tokens, in an order consistent with real
// time (a grant that returned before another was invoked has the lower
// token); a write with token t is accepted only if t was granted and is at
// least the highest accepted token, and refused only if it is lower. A
// failed acquisition and a release change nothing: a holder may lose its
// grant at any moment without a call (its session expired), which is why
// exclusion itself is checked by the fence and the Tracker, not here.
var FencedMutex = porcupine.Model{
	Init: func() any { return mutexState{} },
	Step: func(state, input, output any) (bool, any) {
		s := state.(mutexState)
		op := input.(Op)
		switch op.Kind {
		case Acquire:
			if !op.OK {
				return true, s
			}
			if op.Token <= s.granted {
				return false, s
			}
			return true, mutexState{granted: op.Token, written: s.written}
		case Put:
			if op.OK {
				if op.Token > s.granted || op.Token < s.written {
					return false, s
				}
				return true, mutexState{granted: s.granted, written: op.Token}
			}
			return op.Token < s.written, s
		default:
			return true, s
		}
	},
	DescribeOperation: func(input, output any) string {
		op := input.(Op)
		return fmt.Sprintf("client %d %v token %d ok=%v", op.Client, op.Kind, op.Token, op.OK)
	},
	DescribeState: func(state any) string {
		s := state.(mutexState)
		return fmt.Sprintf("granted %d, written %d", s.granted, s.written)
	},
}

// CheckLinearizable checks ops against FencedMutex (with shared, the
// semaphore's variant, where permits admitted by one write share its index
// as their token, so a grant may repeat the latest token), for at most
// timeout, and returns porcupine's verdict (porcupine.Unknown if it timed
// out).
func CheckLinearizable(ops []Op, shared bool, timeout time.Duration) porcupine.CheckResult {
	hist := make([]porcupine.Operation, 0, len(ops))
	for _, op := range ops {
		if op.Kind == End || op.Kind == Want {
			continue
		}
		hist = append(hist, porcupine.Operation{ClientId: op.Client, Input: op, Call: int64(op.Call), Output: nil, Return: int64(op.Return)})
	}
	return porcupine.CheckOperationsTimeout(fencedModel(shared), hist, timeout)
}

// Explain lists simple witnesses of a non-linearizable history, for the
// report: a grant that returned before another was invoked but has the
// higher token, a token granted twice, and an accepted write whose token no
// grant returned before the write began.
func Explain(ops []Op, shared bool) []string {
	var out []string
	var grants []Op
	for _, op := range ops {
		if op.Kind == Acquire && op.OK {
			grants = append(grants, op)
		}
	}
	seen := map[holdfast.Token]Op{}
	for _, g := range grants {
		if o, dup := seen[g.Token]; dup && !shared {
			out = append(out, fmt.Sprintf("token %d granted twice: to client %d at %v and to client %d at %v", g.Token, o.Client, o.Return, g.Client, g.Return))
		}
		seen[g.Token] = g
	}
	for _, a := range grants {
		for _, b := range grants {
			if a.Return < b.Call && a.Token > b.Token && len(out) < 10 {
				out = append(out, fmt.Sprintf("client %d's grant of token %d returned at %v, before client %d asked (at %v) and got the lower token %d", a.Client, a.Token, a.Return, b.Client, b.Call, b.Token))
			}
		}
	}
	for _, w := range ops {
		if w.Kind != Put || !w.OK {
			continue
		}
		if g, ok := seen[w.Token]; !ok || g.Return > w.Call && !shared {
			out = append(out, fmt.Sprintf("client %d's write with token %d accepted at %v, but no grant of that token returned before it", w.Client, w.Token, w.Call))
		}
	}
	return out
}

// CheckReleases returns one line per successful release (Unlock returned
// nil) of a grant that a grant of a higher token had superseded before the
// Unlock was called: for a lock or an election (one holder at a time), an
// Unlock that reports success must have ended a grant that was still held.
// A holder whose key was deleted from outside, or whose session expired,
// must hear ErrNotHeld, not success: an application that trusts the
// success takes its critical section for completed under the lock. (Not
// for a semaphore, whose permits are superseded by nobody.)
func CheckReleases(ops []Op) []string {
	var bad []string
	for _, r := range ops {
		if r.Kind != Release || !r.OK {
			continue
		}
		for _, a := range ops {
			if a.Kind == Acquire && a.OK && a.Token > r.Token && a.Return < r.Call {
				bad = append(bad, fmt.Sprintf("client %d's Unlock of token %d (called at %v) succeeded, but client %d had been granted token %d at %v", r.Client, r.Token, r.Call, a.Client, a.Token, a.Return))
				break
			}
		}
	}
	return bad
}
