//go:build holdfast_mutants

package core

import (
	"errors"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
)

// TestSetClockRate: at rate 0.5 the Keeper's deadline, TTL - margin after
// the send time on the client's clock, falls twice as far in real time;
// rates outside (0, 1] are refused; rate 1 restores the real clock.
func TestSetClockRate(t *testing.T) {
	for _, bad := range []float64{0, -1, 1.5} {
		if err := SetClockRate(bad); !errors.Is(err, holdfast.ErrInvalidArgument) {
			t.Errorf("SetClockRate(%v): %v, want ErrInvalidArgument", bad, err)
		}
	}
	if err := SetClockRate(0.5); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	k := NewKeeper(sent, 10*time.Second, 2*time.Second)
	defer k.End(errors.New("done"))
	if got, want := k.Deadline().Sub(sent), 16*time.Second; got != want {
		t.Errorf("deadline at rate 0.5: sent + %v, want sent + %v", got, want)
	}
	k.Renewed(sent.Add(time.Second), 10*time.Second, 2*time.Second)
	if got, want := k.Deadline().Sub(sent), 17*time.Second; got != want {
		t.Errorf("after a renewal sent 1 s later: sent + %v, want sent + %v", got, want)
	}
	if err := SetClockRate(1); err != nil {
		t.Fatal(err)
	}
	k2 := NewKeeper(sent, 10*time.Second, 2*time.Second)
	defer k2.End(errors.New("done"))
	if got, want := k2.Deadline().Sub(sent), 8*time.Second; got != want {
		t.Errorf("deadline at rate 1: sent + %v, want sent + %v", got, want)
	}
}
