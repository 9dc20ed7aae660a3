package safety

import (
	"fmt"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
)

// Write is one write the resource received.
type Write struct {
	Client   int
	Token    holdfast.Token
	Accepted bool
	At       time.Duration // since the resource was made
}

// Resource is a fenced resource: it accepts a write only with a token at
// least the highest it has accepted, and records every write.
type Resource struct {
	start   time.Time
	mu      sync.Mutex
	highest holdfast.Token
	writes  []Write
}

// NewResource returns an empty resource.
func NewResource() *Resource { return &Resource{start: time.Now()} }

// Write applies a write from client with token, or refuses it with an
// error wrapping holdfast.ErrStaleToken.
func (r *Resource) Write(client int, token holdfast.Token) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := Write{Client: client, Token: token, At: time.Since(r.start), Accepted: token >= r.highest}
	r.writes = append(r.writes, w)
	if !w.Accepted {
		return fmt.Errorf("%w: token %d after %d", holdfast.ErrStaleToken, token, r.highest)
	}
	r.highest = token
	return nil
}

// Writes returns every write received, in order.
func (r *Resource) Writes() []Write {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Write(nil), r.writes...)
}

// CheckFence returns one line per accepted write whose token is lower than
// a token accepted before it: none, if the resource works.
func CheckFence(writes []Write) []string {
	var bad []string
	var highest holdfast.Token
	for i, w := range writes {
		if !w.Accepted {
			continue
		}
		if w.Token < highest {
			bad = append(bad, fmt.Sprintf("write %d (client %d, token %d) accepted after token %d", i, w.Client, w.Token, highest))
		}
		highest = max(highest, w.Token)
	}
	return bad
}
