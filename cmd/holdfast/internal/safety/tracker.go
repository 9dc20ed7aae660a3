package safety

import (
	"fmt"
	"sync"

	"github.com/holdfast/holdfast"
)

// Tracker checks, at each grant, that the grants of lower tokens held by
// other clients are over: their contexts are done (Limit 1), or at most
// Limit grants are live (a semaphore). It is safe for concurrent use.
type Tracker struct {
	Limit int // grants allowed at once; 0 means 1

	mu         sync.Mutex
	live       map[int]holdfast.Grant // by client
	exempt     map[holdfast.Token]bool
	violations []string
	grants     int
}

// Granted records that client was granted g and checks the others.
func (t *Tracker) Granted(client int, g holdfast.Grant) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.live == nil {
		t.live = map[int]holdfast.Grant{}
	}
	t.grants++
	limit := max(t.Limit, 1)
	alive := 1
	var others []string
	for c, h := range t.live {
		if c == client || h.Context().Err() != nil || t.exempt[h.Token()] {
			continue
		}
		alive++
		others = append(others, fmt.Sprintf("client %d (token %d)", c, h.Token()))
	}
	if alive > limit {
		t.violations = append(t.violations, fmt.Sprintf("client %d granted token %d while %d grant(s) were live (limit %d); the others: %v", client, g.Token(), alive, limit, others))
	}
	t.live[client] = g
}

// Ended records that client's grant is over (released or lost).
func (t *Tracker) Ended(client int) {
	t.mu.Lock()
	delete(t.live, client)
	t.mu.Unlock()
}

// Exempt marks the grant with token as ended from outside (its session
// killed by an operator): nobody could be told before it happened.
func (t *Tracker) Exempt(token holdfast.Token) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exempt == nil {
		t.exempt = map[holdfast.Token]bool{}
	}
	t.exempt[token] = true
}

// Grant returns client's current grant, or nil.
func (t *Tracker) Grant(client int) holdfast.Grant {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live[client]
}

// Holder returns a client that holds a grant whose context is not done,
// if any.
func (t *Tracker) Holder() (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c, g := range t.live {
		if g.Context().Err() == nil {
			return c, true
		}
	}
	return 0, false
}

// LiveTokens returns the tokens of the grants currently recorded as held.
func (t *Tracker) LiveTokens() map[int]holdfast.Token {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[int]holdfast.Token{}
	for c, g := range t.live {
		out[c] = g.Token()
	}
	return out
}

// Violations returns what the tracker saw go wrong, and how many grants it
// checked.
func (t *Tracker) Violations() ([]string, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.violations...), t.grants
}
