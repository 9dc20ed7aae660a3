package holdfast

import (
	"errors"
	"fmt"
	"sync"
)

// ErrStaleToken is returned by Fence.Admit for a token lower than one the fence
// has already admitted.
var ErrStaleToken = errors.New("holdfast: stale fencing token")

// Fence is the resource side of fencing, in memory: it remembers the highest
// token it has admitted and refuses lower ones. A real resource keeps that
// number next to the data it protects (a column, an object's metadata) and
// checks it in the same transaction as the write.
//
// Use one Fence per lock: tokens of different locks are not comparable in
// general. The zero value is ready to use and safe for concurrent use.
type Fence struct {
	mu  sync.Mutex
	max Token
}

// Admit accepts t if it is at least the highest token admitted so far (the
// same holder may write many times under one token), and records it.
// Otherwise it returns an error wrapping ErrStaleToken.
func (f *Fence) Admit(t Token) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t < f.max {
		return fmt.Errorf("%w: %d < %d", ErrStaleToken, t, f.max)
	}
	f.max = t
	return nil
}

// Do runs write while holding the fence, if t is admitted, so that no write
// under an older token can interleave with it. It returns an error wrapping
// ErrStaleToken, without running write, if t is stale.
func (f *Fence) Do(t Token, write func()) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t < f.max {
		return fmt.Errorf("%w: %d < %d", ErrStaleToken, t, f.max)
	}
	f.max = t
	write()
	return nil
}

// Max returns the highest token admitted so far (0 if none).
func (f *Fence) Max() Token {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.max
}
