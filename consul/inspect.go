package consul

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// Inspect reads what Consul holds of name, writing nothing: the kind of
// primitive (from the lock key's flags and value), its holders and waiters
// in order with their tokens and sessions (TTL and lock-delay; Consul does
// not say how long a session has left), and whether holdfast or a native
// client (api.Lock, `consul lock`, api.Semaphore, `consul lock -n`) wrote
// each key. holdfast's bookkeeping (the tail key, the queue's links and
// marks, the holder's own entry, the values that mark permits) is read,
// never shown as data.
//
// It costs one consistent read of the keys under "<name>/" and one session
// lookup per contender. A lock key with an empty value is a lock's (as
// api.Lock and `consul lock` write it); one whose value holdfast does not
// write is an election's, whose value is the leader's proposal and whose
// origin is unknown (holdfast's Election and an api.Lock elector write the
// same). A free lock or election leaves no key behind: its kind is then
// holdfast.KindUnknown. A claim's keys (see Once) give holdfast.KindClaim,
// its last period and the run, if any. Errors: an invalid name wraps
// holdfast.ErrInvalidName (before any request), an ACL refusal
// holdfast.ErrPermissionDenied.
func Inspect(ctx context.Context, c *api.Client, name string) (*holdfast.State, error) {
	if ctx == nil || c == nil {
		return nil, fmt.Errorf("%w: nil context or client", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, err
	}
	pairs, meta, err := c.KV().List(name+"/", (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, apiError("inspect "+name, err)
	}
	st := &holdfast.State{Name: name, Index: meta.LastIndex}
	sessions := map[string]*api.SessionEntry{}
	contender := func(p *api.KVPair) holdfast.Contender {
		ct := holdfast.Contender{Key: p.Key, Session: p.Session, Left: -1}
		s, ok := sessions[p.Session]
		if !ok {
			s, _, _ = c.Session().Info(p.Session, (&api.QueryOptions{}).WithContext(ctx)) // nil: unknown
			sessions[p.Session] = s
		}
		if s != nil {
			ct.TTL, _ = time.ParseDuration(s.TTL)
			ct.LockDelay = s.LockDelay
		}
		return ct
	}
	if inspectClaim(st, pairs, contender) {
		return st, nil
	}
	lockKey := LockKey(name)
	var lock *api.KVPair
	for _, p := range pairs {
		if p.Key == lockKey {
			lock = p
		}
	}
	if lock != nil && (lock.Flags == api.SemaphoreFlagValue || lock.Flags == RWMutexFlagValue) {
		inspectPermits(st, lock, pairs, contender)
		return st, nil
	}

	// A lock or an election: the lock key, and holdfast's queue.
	queuePrefix, tailKey := name+queueInfix, name+tailSuffix
	var queue []*api.KVPair
	for _, p := range pairs {
		switch id, inQueue := strings.CutPrefix(p.Key, queuePrefix); {
		case p.Key == lockKey && p.Flags == api.LockFlagValue, p.Key == tailKey:
		case inQueue && id != "" && !strings.Contains(id, "/"):
			if p.Session != "" && (lock == nil || p.Session != lock.Session) { // else a dead entry, or the holder's own
				queue = append(queue, p)
			}
		case inQueue && id != "": // an entry's links and marks
		default:
			st.Other = append(st.Other, p.Key)
		}
	}
	if lock != nil && lock.Flags == api.LockFlagValue {
		st.Kind = holdfast.KindLock
		v := string(lock.Value)
		ct := holdfast.Contender{Origin: holdfast.OriginHoldfast, Token: holdfast.Token(tokenOf(lock))}
		switch {
		case strings.HasPrefix(v, valueTaken):
		case v == "":
			ct.Origin = holdfast.OriginNative
		default:
			st.Kind = holdfast.KindElection
			ct.Origin, ct.Value, ct.Token = holdfast.OriginUnknown, lock.Value, leaderOf(lock).Term
		}
		if lock.Session != "" {
			h := contender(lock)
			h.Origin, h.Value, h.Token = ct.Origin, ct.Value, ct.Token
			st.Holders = append(st.Holders, h)
		}
	}
	slices.SortFunc(queue, func(a, b *api.KVPair) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	for _, p := range queue {
		w := contender(p)
		w.Origin = holdfast.OriginHoldfast
		st.Waiters = append(st.Waiters, w)
	}
	return st, nil
}

// inspectPermits fills st from a semaphore's or a read-write lock's keys
// (api.Semaphore's layout, see Semaphore and RWMutex): the holders that
// the lock key names and that still hold their contender key, then the
// other live contenders, each group by arrival (CreateIndex).
func inspectPermits(st *holdfast.State, lock *api.KVPair, pairs api.KVPairs, contender func(*api.KVPair) holdfast.Contender) {
	rw := lock.Flags == RWMutexFlagValue
	var ps permitState
	var err error
	if rw {
		st.Kind = holdfast.KindRWMutex
		ps, err = decodeRWLock(lock.Value)
	} else {
		st.Kind = holdfast.KindSemaphore
		ps, err = decodeSemaphoreLock(lock.Value, 0)
	}
	if err != nil {
		st.Other = append(st.Other, fmt.Sprintf("%s (%v)", lock.Key, err))
	}
	st.Limit = ps.limit
	var holders, waiters []*api.KVPair
	for _, p := range pairs {
		id, _ := strings.CutPrefix(p.Key, st.Name+"/")
		switch {
		case p == lock:
		case strings.Contains(id, "/") || p.Flags != lock.Flags:
			st.Other = append(st.Other, p.Key)
		case p.Session == "":
			// a dead contender's key, pruned by the next write
		default:
			if _, in := ps.holders[p.Session]; in {
				holders = append(holders, p)
			} else {
				waiters = append(waiters, p)
			}
		}
	}
	byArrival := func(a, b *api.KVPair) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) }
	slices.SortFunc(holders, byArrival)
	slices.SortFunc(waiters, byArrival)
	describe := func(p *api.KVPair, held bool) holdfast.Contender {
		ct := contender(p)
		switch v := string(p.Value); v {
		case valHeld, valHeldNext, valDowngraded:
			ct.Origin = holdfast.OriginHoldfast
			if held {
				ct.Token = holdfast.Token(p.ModifyIndex) // the write that admitted it
			}
		case valWait, valRead, valWrite:
			ct.Origin = holdfast.OriginHoldfast
		default:
			ct.Origin = holdfast.OriginNative
			if len(p.Value) > 0 {
				ct.Value = p.Value
			}
		}
		if rw {
			ct.Mode = "read"
			if exclusive, in := ps.holders[p.Session]; in && exclusive || !in && string(p.Value) == valWrite {
				ct.Mode = "write"
			}
		}
		return ct
	}
	for _, p := range holders {
		st.Holders = append(st.Holders, describe(p, true))
	}
	for _, p := range waiters {
		st.Waiters = append(st.Waiters, describe(p, false))
	}
}

// inspectClaim fills st from a claim's keys (ClaimFlags, see Once) and
// reports whether there were any: the record's period and token, and the
// run that holds the mark, if any; the other keys under the name are
// Other. A claim key of an older holdfast (held, JSON) is shown as the
// holder, its value as is.
func inspectClaim(st *holdfast.State, pairs api.KVPairs, contender func(*api.KVPair) holdfast.Contender) bool {
	record, run := st.Name+"/.claim", st.Name+"/.run"
	var found bool
	for _, p := range pairs {
		found = found || p.Flags == ClaimFlags && (p.Key == record || p.Key == run)
	}
	if !found {
		return false
	}
	st.Kind = holdfast.KindClaim
	for _, p := range pairs {
		switch {
		case p.Flags != ClaimFlags || p.Key != record && p.Key != run:
			st.Other = append(st.Other, p.Key)
		case p.Session == "":
			st.Period, _ = core.ParsePeriod(p.Value)
			st.PeriodToken = holdfast.Token(p.ModifyIndex)
		default:
			ct := contender(p)
			ct.Origin, ct.Token = holdfast.OriginHoldfast, holdfast.Token(p.ModifyIndex)
			if _, ok := core.ParsePeriod(p.Value); !ok {
				ct.Value = p.Value
			}
			st.Holders = append(st.Holders, ct)
		}
	}
	return true
}
