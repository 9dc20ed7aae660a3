package holdfast_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
)

func TestFenceAdmit(t *testing.T) {
	var f holdfast.Fence
	if f.Max() != 0 {
		t.Fatalf("Max() of a zero Fence = %v, want 0", f.Max())
	}
	steps := []struct {
		token holdfast.Token
		stale bool
		max   holdfast.Token
	}{
		{5, false, 5},
		{5, false, 5}, // the same holder writes again under its token
		{7, false, 7},
		{6, true, 7}, // an older holder, after 7 was admitted
		{5, true, 7},
		{1, true, 7},
		{7, false, 7},
		{8, false, 8},
		{math.MaxUint64, false, math.MaxUint64},
		{math.MaxUint64 - 1, true, math.MaxUint64},
	}
	for i, s := range steps {
		err := f.Admit(s.token)
		switch {
		case s.stale && !errors.Is(err, holdfast.ErrStaleToken):
			t.Errorf("step %d: Admit(%v) = %v, want ErrStaleToken", i, s.token, err)
		case !s.stale && err != nil:
			t.Errorf("step %d: Admit(%v) = %v, want nil", i, s.token, err)
		}
		if got := f.Max(); got != s.max {
			t.Errorf("step %d: Max() after Admit(%v) = %v, want %v", i, s.token, got, s.max)
		}
	}
}

func TestFenceStaleError(t *testing.T) {
	var f holdfast.Fence
	if err := f.Admit(12); err != nil {
		t.Fatal(err)
	}
	err := f.Admit(9)
	if !errors.Is(err, holdfast.ErrStaleToken) {
		t.Fatalf("Admit(9) after 12: %v, want ErrStaleToken", err)
	}
	if errors.Is(err, holdfast.ErrNotHeld) || errors.Is(err, holdfast.ErrLost) {
		t.Errorf("stale token error %v wraps a grant error", err)
	}
}

func TestFenceDo(t *testing.T) {
	var f holdfast.Fence
	var writes []holdfast.Token
	write := func(tok holdfast.Token) func() {
		return func() { writes = append(writes, tok) }
	}
	for _, tok := range []holdfast.Token{3, 3, 4} {
		if err := f.Do(tok, write(tok)); err != nil {
			t.Fatalf("Do(%v): %v", tok, err)
		}
	}
	err := f.Do(2, func() { t.Error("Do ran the write of a stale token") })
	if !errors.Is(err, holdfast.ErrStaleToken) {
		t.Errorf("Do(2) after 4: %v, want ErrStaleToken", err)
	}
	if f.Max() != 4 {
		t.Errorf("Max() = %v, want 4", f.Max())
	}
	// Do records the token like Admit: a later Admit of an older token is
	// refused.
	if err := f.Do(10, write(10)); err != nil {
		t.Fatalf("Do(10): %v", err)
	}
	if err := f.Admit(9); !errors.Is(err, holdfast.ErrStaleToken) {
		t.Errorf("Admit(9) after Do(10): %v, want ErrStaleToken", err)
	}
	if want := []holdfast.Token{3, 3, 4, 10}; !slices.Equal(writes, want) {
		t.Errorf("writes %v, want %v", writes, want)
	}
}

// Do holds the fence while write runs: a newer token cannot be admitted in
// the middle of the write, so the write cannot interleave with the newer
// holder's (and Admit of the newer token waits for it).
func TestFenceDoHoldsFenceDuringWrite(t *testing.T) {
	var f holdfast.Fence
	admitted := make(chan error, 1)
	err := f.Do(5, func() {
		go func() { admitted <- f.Admit(6) }()
		select {
		case err := <-admitted:
			t.Errorf("Admit(6) returned (%v) while Do(5)'s write was running", err)
		case <-time.After(20 * time.Millisecond):
		}
	})
	if err != nil {
		t.Fatalf("Do(5): %v", err)
	}
	select {
	case err := <-admitted:
		if err != nil {
			t.Errorf("Admit(6) after Do(5): %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Admit(6) still blocked after Do returned")
	}
	if err := f.Do(5, func() { t.Error("stale write ran") }); !errors.Is(err, holdfast.ErrStaleToken) {
		t.Errorf("Do(5) after 6: %v, want ErrStaleToken", err)
	}
}

// The fence stays usable after a write panics.
func TestFenceDoWritePanics(t *testing.T) {
	var f holdfast.Fence
	func() {
		defer func() { _ = recover() }()
		_ = f.Do(3, func() { panic("write failed") })
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := f.Admit(3); err != nil {
			t.Errorf("Admit(3) after a panicking write: %v", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the fence stayed locked after a write panicked")
	}
}

// Many writers with random tokens: the writes that run form a non-decreasing
// sequence, every refused token is lower than one admitted before it, and
// Max is the highest token offered.
func TestFenceConcurrent(t *testing.T) {
	var f holdfast.Fence
	var order []holdfast.Token // appended inside Do's write, under the fence
	var mu sync.Mutex
	var refused []holdfast.Token
	var highest holdfast.Token
	var wg sync.WaitGroup
	for w := range 8 {
		r := rand.New(rand.NewPCG(uint64(w), 1))
		wg.Go(func() {
			for range 500 {
				tok := holdfast.Token(r.IntN(1000) + 1)
				mu.Lock()
				highest = max(highest, tok)
				mu.Unlock()
				var err error
				if r.IntN(2) == 0 {
					err = f.Do(tok, func() { order = append(order, tok) })
				} else {
					err = f.Admit(tok)
					if err == nil {
						// Admit runs no write; record nothing.
						continue
					}
				}
				switch {
				case err == nil:
				case errors.Is(err, holdfast.ErrStaleToken):
					mu.Lock()
					refused = append(refused, tok)
					mu.Unlock()
				default:
					t.Errorf("token %v: %v", tok, err)
				}
			}
		})
	}
	wg.Wait()
	if !slices.IsSorted(order) {
		t.Error("writes ran out of token order")
	}
	if f.Max() != highest {
		t.Errorf("Max() = %v, want the highest token offered, %v", f.Max(), highest)
	}
	for _, tok := range refused {
		if tok >= f.Max() {
			t.Errorf("token %v refused although not lower than Max %v", tok, f.Max())
		}
	}
	if len(refused) == 0 {
		t.Error("no token refused among 4000 random ones")
	}
}

func TestTokenString(t *testing.T) {
	for _, c := range []struct {
		tok  holdfast.Token
		want string
	}{
		{0, "0"},
		{1, "1"},
		{42, "42"},
		{1234567890123, "1234567890123"},
		{math.MaxUint64, "18446744073709551615"},
	} {
		if got := c.tok.String(); got != c.want {
			t.Errorf("Token(%d).String() = %q, want %q", uint64(c.tok), got, c.want)
		}
		if got := fmt.Sprint(c.tok); got != c.want {
			t.Errorf("fmt.Sprint(Token(%d)) = %q, want %q", uint64(c.tok), got, c.want)
		}
	}
	var _ fmt.Stringer = holdfast.Token(0)
}
