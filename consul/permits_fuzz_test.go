package consul

import (
	"encoding/json"
	"maps"
	"testing"
)

// FuzzSemaphoreLock: the decoder of a Semaphore's lock value never panics;
// what it accepts has a limit of at least 1 and survives a round trip through
// the encoder (so holdfast never rewrites a value it misread), and
// api.Semaphore's own decoding (json into {Limit, Holders}) agrees on the
// limit and the holders.
func FuzzSemaphoreLock(f *testing.F) {
	for _, seed := range []string{
		``,
		`{"Limit":4,"Holders":{}}`,
		`{"Limit":2,"Holders":{"7a1c0f3e-0000-4000-8000-000000000001":true,"b":true}}`,
		`{"Limit":1,"Holders":{"a":false}}`,
		`{"Limit":3,"Holders":null}`,
		`{"Limit":3}`,
		`{"limit":3,"holders":{"a":true}}`,
		`{"Limit":0,"Holders":{}}`,
		`{"Limit":-1}`,
		`{"Limit":1e100}`,
		`{"Limit":"2"}`,
		`{"Limit":2,"Holders":[]}`,
		`{"Limit":2,"Holders":{"a":1}}`,
		`null`,
		`[]`,
		`"x"`,
		`{`,
		"\xff\xfe",
		`{"Limit":2,"Holders":{"a":true},"Extra":[1,2,3]}`,
		`holdfast`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		st, err := decodeSemaphoreLock(value, 5)
		if err != nil {
			return
		}
		if st.limit < 1 || st.holders == nil {
			t.Fatalf("accepted %q as limit %d, holders %v", value, st.limit, st.holders)
		}
		enc := encodeLock(st)
		again, err := decodeSemaphoreLock(enc, 7)
		if err != nil || again.limit != st.limit || !maps.Equal(again.holders, st.holders) {
			t.Fatalf("round trip of %q: %q -> %+v, %v", value, enc, again, err)
		}
		if len(value) == 0 {
			return
		}
		var l semaphoreLock // api.Semaphore's decoding
		if err := json.Unmarshal(value, &l); err != nil {
			t.Fatalf("holdfast accepted %q, api.Semaphore would not: %v", value, err)
		}
		if l.Limit != st.limit || len(l.Holders) != len(st.holders) {
			t.Fatalf("%q: holdfast reads limit %d and %d holders, api.Semaphore %d and %d", value, st.limit, len(st.holders), l.Limit, len(l.Holders))
		}
	})
}

// FuzzRWLock: the decoder of an RWMutex's lock value never panics; what it
// accepts has at most one writer and no reader beside it, and survives a
// round trip.
func FuzzRWLock(f *testing.F) {
	for _, seed := range []string{
		``,
		`{"Holders":{}}`,
		`{"Holders":{"a":"read","b":"read"}}`,
		`{"Holders":{"a":"write"}}`,
		`{"Holders":{"a":"write","b":"read"}}`,
		`{"Holders":{"a":"write","b":"write"}}`,
		`{"Holders":{"a":"admin"}}`,
		`{"Holders":{"a":true}}`,
		`{"Limit":2,"Holders":{"a":true}}`,
		`null`,
		`{`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		st, err := decodeRWLock(value, 0)
		if err != nil {
			return
		}
		writers := 0
		for _, x := range st.holders {
			if x {
				writers++
			}
		}
		if writers > 1 || writers == 1 && len(st.holders) > 1 {
			t.Fatalf("accepted %q: %v", value, st.holders)
		}
		again, err := decodeRWLock(encodeLock(st), 0)
		if err != nil || !maps.Equal(again.holders, st.holders) {
			t.Fatalf("round trip of %q: %+v, %v", value, again, err)
		}
	})
}
