package consul

import (
	"encoding/json"
	"fmt"
	"maps"
)

// permitState is the content of the lock key: who holds a permit.
type permitState struct {
	limit   int             // a Semaphore's limit; 0 for an RWMutex
	holders map[string]bool // by session ID; true: exclusive (an RWMutex's writer)
}

func (st permitState) clone() permitState { return permitState{st.limit, maps.Clone(st.holders)} }

// semaphoreLock is api.Semaphore's lock value.
type semaphoreLock struct {
	Limit   int
	Holders map[string]bool
}

// decodeSemaphoreLock decodes a Semaphore's lock value as api.Semaphore
// does: every name in Holders holds a permit (whatever its boolean). A value
// that is not such JSON, or a limit below 1, is an error.
func decodeSemaphoreLock(value []byte, limit int) (permitState, error) {
	st := permitState{limit: limit, holders: map[string]bool{}}
	if len(value) == 0 {
		return st, nil
	}
	var l semaphoreLock
	if err := json.Unmarshal(value, &l); err != nil {
		return permitState{}, fmt.Errorf("not a semaphore's JSON value: %w", err)
	}
	if st.limit = l.Limit; l.Limit < 1 {
		return permitState{}, fmt.Errorf("semaphore limit %d", l.Limit)
	}
	for h := range l.Holders {
		st.holders[h] = false
	}
	return st, nil
}

func encodeSemaphoreLock(st permitState) []byte {
	l := semaphoreLock{Limit: st.limit, Holders: make(map[string]bool, len(st.holders))}
	for h := range st.holders {
		l.Holders[h] = true
	}
	b, _ := json.Marshal(l) // cannot fail
	return b
}

// decodeRWLock decodes an RWMutex's lock value,
// {"Holders":{"<session>":"read"|"write"}}; another mode, or a writer beside
// anyone, is an error.
func decodeRWLock(value []byte) (permitState, error) {
	st := permitState{holders: map[string]bool{}}
	var l struct{ Holders map[string]string }
	if len(value) == 0 {
		return st, nil
	} else if err := json.Unmarshal(value, &l); err != nil {
		return permitState{}, fmt.Errorf("not a read-write lock's JSON value: %w", err)
	}
	for h, mode := range l.Holders {
		if mode != "read" && mode != "write" {
			return permitState{}, fmt.Errorf("holder %q has mode %q", h, mode)
		}
		if st.holders[h] = mode == "write"; st.holders[h] && len(l.Holders) > 1 {
			return permitState{}, fmt.Errorf("a writer and %d other holders", len(l.Holders)-1)
		}
	}
	return st, nil
}

func encodeRWLock(st permitState) []byte {
	modes := map[bool]string{false: "read", true: "write"}
	l := struct{ Holders map[string]string }{make(map[string]string, len(st.holders))}
	for h, x := range st.holders {
		l.Holders[h] = modes[x]
	}
	b, _ := json.Marshal(l)
	return b
}
