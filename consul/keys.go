package consul

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"
)

// The lock key's value while a Mutex holds it; the keys under a queue
// entry and the tail key (docs/DESIGN.md, "Consul acquire").
const (
	valueTaken = "holdfast"
	nextInfix  = "/next/"
	prevInfix  = "/prev/"
	heldSuffix = "/held"
	tailSuffix = "/.tail"
)

// waiter is a queue entry the lock can be handed to.
type waiter struct {
	key, session string
	index        uint64 // the entry's CreateIndex (= its ModifyIndex)
}

// entry returns the queue entry of session with that CreateIndex.
func (m *Mutex) entry(session string, index uint64) waiter {
	return waiter{key: m.queuePrefix() + session, session: session, index: index}
}

// tokenOf returns the fencing token of lock's holder: the ModifyIndex of
// the write that acquired it.
func tokenOf(lock *api.KVPair) uint64 { return lock.ModifyIndex }

// tailEntry returns the entry that the tail key names: "<session>" (its
// CreateIndex is then the tail's ModifyIndex) or "<session> <index>"; ok
// false if absent or unreadable.
func (m *Mutex) tailEntry(tail *api.KVPair) (waiter, bool) {
	if tail == nil || tail.ModifyIndex == 0 {
		return waiter{}, false
	}
	session, idx, ok := strings.Cut(string(tail.Value), " ")
	index, err := strconv.ParseUint(idx, 10, 64)
	if !ok {
		index, err = tail.ModifyIndex, nil
	}
	if err != nil || session == "" || index == 0 || strings.Contains(session, "/") {
		return waiter{}, false
	}
	return m.entry(session, index), true
}

// txnKVs returns the keys of a transaction's results.
func txnKVs(results []*api.TxnResult) api.KVPairs {
	pairs := make(api.KVPairs, 0, len(results))
	for _, r := range results {
		if r.KV != nil {
			pairs = append(pairs, r.KV)
		}
	}
	return pairs
}

// view is what we know of a lock: the keys under "<name>/".
type view struct {
	lock, tail  *api.KVPair   // nil if absent
	queue, dead []*api.KVPair // live entries by CreateIndex; keys whose session is gone
	me          *api.KVPair   // our live entry
	other       string        // a live key of a longer name, if any
	// Under our entry: the latest link, our latest anchor, the held mark.
	next         *waiter
	anchor, held *api.KVPair
	// holders are the sessions whose entry has a held mark.
	holders map[string]bool
}

// waiting returns the number of live entries without a held mark.
func (v view) waiting() int {
	n := 0
	for _, e := range v.queue {
		if !v.holders[e.Session] {
			n++
		}
	}
	return n
}

// parse builds a view from keys read under "<name>/" (a repeated key: the
// first answer counts, but the lock key's last).
func (m *Mutex) parse(pairs api.KVPairs) view {
	var v view
	seen := make(map[string]bool, len(pairs))
	var children []*api.KVPair // other entries' links and marks
	for _, e := range pairs {
		switch {
		case e.ModifyIndex == 0:
		case e.Key == m.lockKey():
			v.lock = e
		case e.Key == m.tailKey():
			v.tail = e
		case !seen[e.Key]:
			seen[e.Key] = true
			if v.add(m, e) {
				children = append(children, e)
			}
		}
	}
	slices.SortFunc(v.queue, func(x, y *api.KVPair) int { return cmp.Compare(x.CreateIndex, y.CreateIndex) })
	for _, e := range children { // under a gone entry: dead too
		if entry, _, _ := strings.Cut(strings.TrimPrefix(e.Key, m.queuePrefix()), "/"); !seen[m.queuePrefix()+entry] {
			v.dead = append(v.dead, e)
		}
	}
	return v
}

// add notes e, a key under "<name>/" other than the lock and tail keys, and
// reports whether it lies under another session's entry.
func (v *view) add(m *Mutex, e *api.KVPair) bool {
	id, isQueue := strings.CutPrefix(e.Key, m.queuePrefix())
	session, sub, under := strings.Cut(id, "/")
	switch {
	case !isQueue || id == "":
		if e.Session != "" {
			v.other = e.Key // a live lock of a longer name, or a foreign one
		}
	case under && session == m.s.id:
		v.child(m, sub, e)
	case under:
		if sub == heldSuffix[1:] && e.Session != "" {
			if v.holders == nil {
				v.holders = make(map[string]bool)
			}
			v.holders[session] = true
		}
		return true
	case e.Session == "":
		v.dead = append(v.dead, e)
	default:
		v.queue = append(v.queue, e)
		if session == m.s.id && e.Session == m.s.id {
			v.me = e
		}
	}
	return false
}

// child notes e, the key sub under our entry.
func (v *view) child(m *Mutex, sub string, e *api.KVPair) {
	switch w, isNext := strings.CutPrefix(sub, nextInfix[1:]); {
	case sub == heldSuffix[1:]:
		v.held = e
	case isNext:
		index, err := strconv.ParseUint(string(e.Value), 10, 64)
		if err == nil && w != "" && e.Session == w && (v.next == nil || index > v.next.index) {
			n := m.entry(w, index)
			v.next = &n
		}
	case strings.HasPrefix(sub, prevInfix[1:]):
		if v.anchor == nil || e.CreateIndex > v.anchor.CreateIndex {
			v.anchor = e
		}
	}
}

// predecessor returns the live entry just ahead of ours, or nil at the head.
func (v view) predecessor() *api.KVPair {
	var p *api.KVPair
	for _, e := range v.queue {
		if e.CreateIndex >= v.me.CreateIndex {
			break
		}
		p = e
	}
	return p
}

// free reports whether the lock key is absent or held by no session.
func free(lock *api.KVPair) bool { return lock == nil || lock.Session == "" }
