package consul

import (
	"encoding/json"
	"fmt"
	"maps"
)

// The lock key's value of a Semaphore (api.Semaphore's JSON) and of an
// RWMutex (holdfast's own), and the state both decode to.

// permitState is the content of the lock key: who holds a permit.
type permitState struct {
	limit   int             // a Semaphore's limit; 0 for an RWMutex
	holders map[string]bool // by session ID; true: exclusive (an RWMutex's writer)
}

func (st permitState) clone() permitState {
	return permitState{limit: st.limit, holders: maps.Clone(st.holders)}
}

// decodeLock decodes a lock value: an RWMutex's if limit is 0, else a
// Semaphore's (see decodeRWLock and decodeSemaphoreLock).
func decodeLock(value []byte, limit int) (permitState, error) {
	if limit == 0 {
		return decodeRWLock(value)
	}
	return decodeSemaphoreLock(value, limit)
}

// encodeLock is the inverse of decodeLock.
func encodeLock(st permitState) []byte {
	if st.limit == 0 {
		return encodeRWLock(st)
	}
	return encodeSemaphoreLock(st)
}

// semaphoreLock is api.Semaphore's lock value.
type semaphoreLock struct {
	Limit   int
	Holders map[string]bool
}

// decodeSemaphoreLock decodes a Semaphore's lock value as api.Semaphore
// does: an empty value is a fresh lock with the given limit; every name in
// Holders is a holder (whatever its boolean). It never panics; a value that
// is not such JSON, or has a limit below 1, is an error.
func decodeSemaphoreLock(value []byte, limit int) (permitState, error) {
	if len(value) == 0 {
		return permitState{limit: limit, holders: map[string]bool{}}, nil
	}
	var l semaphoreLock
	if err := json.Unmarshal(value, &l); err != nil {
		return permitState{}, fmt.Errorf("not a semaphore's JSON value: %w", err)
	}
	if l.Limit < 1 {
		return permitState{}, fmt.Errorf("semaphore limit %d", l.Limit)
	}
	st := permitState{limit: l.Limit, holders: make(map[string]bool, len(l.Holders))}
	for h := range l.Holders {
		st.holders[h] = false
	}
	return st, nil
}

// encodeSemaphoreLock is the inverse of decodeSemaphoreLock.
func encodeSemaphoreLock(st permitState) []byte {
	l := semaphoreLock{Limit: st.limit, Holders: make(map[string]bool, len(st.holders))}
	for h := range st.holders {
		l.Holders[h] = true
	}
	b, _ := json.Marshal(l) // cannot fail
	return b
}

// rwLock is an RWMutex's lock value: {"Holders":{"<session>":"read"|"write"}}.
type rwLock struct {
	Holders map[string]string
}

// decodeRWLock decodes an RWMutex's lock value: an empty value means no
// holders; one writer and any reader together, or a mode other than "read"
// and "write", is an error.
func decodeRWLock(value []byte) (permitState, error) {
	st := permitState{holders: map[string]bool{}}
	if len(value) == 0 {
		return st, nil
	}
	var l rwLock
	if err := json.Unmarshal(value, &l); err != nil {
		return permitState{}, fmt.Errorf("not a read-write lock's JSON value: %w", err)
	}
	writers := 0
	for h, mode := range l.Holders {
		switch mode {
		case "read":
			st.holders[h] = false
		case "write":
			st.holders[h] = true
			writers++
		default:
			return permitState{}, fmt.Errorf("holder %q has mode %q", h, mode)
		}
	}
	if writers > 0 && len(st.holders) > 1 {
		return permitState{}, fmt.Errorf("a writer and %d other holders", len(st.holders)-1)
	}
	return st, nil
}

func encodeRWLock(st permitState) []byte {
	l := rwLock{Holders: make(map[string]string, len(st.holders))}
	for h, x := range st.holders {
		l.Holders[h] = "read"
		if x {
			l.Holders[h] = "write"
		}
	}
	b, _ := json.Marshal(l)
	return b
}
