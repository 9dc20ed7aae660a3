package consul

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// valueTaken is the lock key's value while a holdfast Mutex holds it.
// Foreign holders (api.Lock, `consul lock`) write other values.
const valueTaken = "holdfast"

// The keys under a queue entry E (docs/DESIGN.md, "Consul acquire"):
// E/next/<W>, the link of the waiter W right behind E (acquired with W's
// session, value W's CreateIndex); E/prev/<P>, E's anchor on its
// predecessor P (acquired with P's session: it goes when P leaves or its
// session ends, which wakes E); E/held, written by the handoff to E.
const (
	nextInfix  = "/next/"
	prevInfix  = "/prev/"
	heldSuffix = "/held"
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

// tokenOf returns the fencing token of the grant that holds lock, a
// Mutex's or an Election's lock key as read from Consul: the ModifyIndex of
// the write that acquired it (a later write by the holder, such as a poke,
// moves it). For a key held by api.Lock or `consul lock`, it is the key's
// ModifyIndex too.
func tokenOf(lock *api.KVPair) uint64 { return lock.ModifyIndex }

// parseEntry parses "<session> <index>" as the queue entry of that session
// under m, with that CreateIndex.
func (m *Mutex) parseEntry(s string) (waiter, bool) {
	session, idx, ok := strings.Cut(s, " ")
	index, err := strconv.ParseUint(idx, 10, 64)
	if !ok || err != nil || session == "" || index == 0 || strings.Contains(session, "/") {
		return waiter{}, false
	}
	return m.entry(session, index), true
}

// tailSuffix makes the tail key "<name>/.tail": it names the entry created
// last, "<session>" (its CreateIndex is the tail's ModifyIndex) or
// "<session> <index>", and is acquired with that entry's session (plain
// during a lock-delay: see relockTail); absent while nobody queues
// (docs/DESIGN.md, "Consul acquire").
const tailSuffix = "/.tail"

// tailEntry returns the entry that the tail key names (ok false if absent
// or unreadable).
func (m *Mutex) tailEntry(tail *api.KVPair) (waiter, bool) {
	if tail == nil || tail.ModifyIndex == 0 {
		return waiter{}, false
	}
	if w, ok := m.parseEntry(string(tail.Value)); ok {
		return w, true
	}
	return m.parseEntry(fmt.Sprintf("%s %d", tail.Value, tail.ModifyIndex))
}

// entryValue is the value of our queue entry: our session's lock-delay in
// milliseconds, so that the waiter behind us knows it (it may hold the lock
// before that waiter, and if its session ends then, the delay applies).
func (m *Mutex) entryValue() []byte {
	return strconv.AppendInt(nil, m.s.cfg.lockDelay.Milliseconds(), 10)
}

// entryDelay returns the lock-delay that entry e's value states.
func entryDelay(e *api.KVPair) (time.Duration, bool) {
	ms, err := strconv.ParseInt(string(e.Value), 10, 64)
	if err != nil || ms < 0 {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// view is what we know of a lock: the keys under "<name>/".
type view struct {
	lock  *api.KVPair   // nil if absent
	queue []*api.KVPair // live queue entries, by CreateIndex
	dead  []*api.KVPair // queue entries whose session is gone
	me    *api.KVPair   // our live queue entry, if any
	tail  *api.KVPair   // the tail key, if present
	other string        // a key of a longer name, if any
	// Under our entry: the live link behind it (the latest), our anchor
	// (the latest), the held mark.
	next   *waiter
	anchor *api.KVPair
	held   *api.KVPair
	// holders are the sessions whose entry has a held mark: the holder,
	// or one that lost its grant and has not left yet.
	holders map[string]bool
}

// waiting returns the number of live entries that wait (no held mark).
func (v view) waiting() int {
	n := 0
	for _, e := range v.queue {
		if !v.holders[e.Session] {
			n++
		}
	}
	return n
}

// parse builds a view from the results of a transaction that read the
// subtree "<name>/" or part of it (other results about those keys are
// merged in; the last answer about the lock key is the latest).
func (m *Mutex) parse(results []*api.TxnResult) view {
	var v view
	seen := make(map[string]bool, len(results))
	var children []*api.KVPair // other entries' links and marks
	for _, r := range results {
		switch e := r.KV; {
		case e == nil || e.ModifyIndex == 0:
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
	for _, e := range children {
		// Under an entry that is gone (deleted with its session, Behavior
		// delete): dead too.
		if entry, _, _ := strings.Cut(strings.TrimPrefix(e.Key, m.queuePrefix()), "/"); !seen[m.queuePrefix()+entry] {
			v.dead = append(v.dead, e)
		}
	}
	return v
}

// add notes e, a key under "<name>/" other than the lock and tail keys. It
// reports whether e lies under another session's entry (a link or a mark).
func (v *view) add(m *Mutex, e *api.KVPair) bool {
	id, isQueue := strings.CutPrefix(e.Key, m.queuePrefix())
	session, sub, under := strings.Cut(id, "/")
	switch {
	case !isQueue || id == "":
		if strings.HasPrefix(e.Key, m.prefix()) && e.Session != "" {
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
	switch {
	case sub == heldSuffix[1:]:
		v.held = e
	case strings.HasPrefix(sub, nextInfix[1:]):
		w := strings.TrimPrefix(sub, nextInfix[1:])
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
