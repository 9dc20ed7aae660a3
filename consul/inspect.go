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

// Inspect reads what Consul holds of name, writing nothing: the primitive's
// kind, its holders and waiters in order (tokens, sessions, origin), and
// the keys that are not its own (Other); a free lock shows KindUnknown. It
// costs a consistent read of "<name>/" and a session lookup per contender.
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
	slices.SortFunc(pairs, func(a, b *api.KVPair) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	st := &holdfast.State{Name: name, Index: meta.LastIndex}
	sessions := map[string]*api.SessionEntry{} // nil: unknown
	contender := func(p *api.KVPair) holdfast.Contender {
		ct := holdfast.Contender{Key: p.Key, Session: p.Session, Left: -1}
		e, ok := sessions[p.Session]
		if !ok {
			e, _, _ = c.Session().Info(p.Session, (&api.QueryOptions{}).WithContext(ctx))
			sessions[p.Session] = e
		}
		if e != nil {
			ct.TTL, _ = time.ParseDuration(e.TTL)
			ct.LockDelay = e.LockDelay
		}
		return ct
	}
	i := slices.IndexFunc(pairs, func(p *api.KVPair) bool { return p.Key == LockKey(name) })
	switch {
	case inspectClaim(st, pairs, contender):
	case i >= 0 && (pairs[i].Flags == api.SemaphoreFlagValue || pairs[i].Flags == RWMutexFlagValue):
		inspectPermits(st, pairs[i], pairs, contender)
	case i >= 0:
		inspectLock(st, pairs[i], pairs, contender)
	default:
		inspectLock(st, nil, pairs, contender)
	}
	return st, nil
}

// inspectLock fills st from a lock's or an election's keys: the lock key
// (nil if absent), and holdfast's queue.
func inspectLock(st *holdfast.State, lock *api.KVPair, pairs api.KVPairs, contender func(*api.KVPair) holdfast.Contender) {
	queuePrefix, tailKey := st.Name+queueInfix, st.Name+tailSuffix
	for _, p := range pairs {
		switch id, inQueue := strings.CutPrefix(p.Key, queuePrefix); {
		case p == lock && p.Flags == api.LockFlagValue, p.Key == tailKey:
		case inQueue && id != "" && !strings.Contains(id, "/"):
			if p.Session != "" && (lock == nil || p.Session != lock.Session) { // else a dead entry, or the holder's own
				w := contender(p)
				w.Origin = holdfast.OriginHoldfast
				st.Waiters = append(st.Waiters, w)
			}
		case inQueue && id != "": // an entry's links and marks
		default:
			st.Other = append(st.Other, p.Key)
		}
	}
	if lock == nil || lock.Flags != api.LockFlagValue {
		return
	}
	st.Kind = holdfast.KindLock
	h := holdfast.Contender{Origin: holdfast.OriginHoldfast, Token: holdfast.Token(tokenOf(lock))}
	switch v := string(lock.Value); {
	case strings.HasPrefix(v, valueTaken):
	case v == "":
		h.Origin = holdfast.OriginNative
	default:
		st.Kind = holdfast.KindElection
		h.Origin, h.Value, h.Token = holdfast.OriginUnknown, lock.Value, leaderOf(lock).Term
	}
	if lock.Session != "" {
		ct := contender(lock)
		ct.Origin, ct.Value, ct.Token = h.Origin, h.Value, h.Token
		st.Holders = append(st.Holders, ct)
	}
}

// inspectPermits fills st from a semaphore's or a read-write lock's keys:
// the holders the lock key names, then the other live contenders.
func inspectPermits(st *holdfast.State, lock *api.KVPair, pairs api.KVPairs, contender func(*api.KVPair) holdfast.Contender) {
	st.Kind = holdfast.KindSemaphore
	ps, err := decodeSemaphoreLock(lock.Value, 0)
	if lock.Flags == RWMutexFlagValue {
		st.Kind = holdfast.KindRWMutex
		ps, err = decodeRWLock(lock.Value, 0)
	}
	if err != nil {
		st.Other = append(st.Other, fmt.Sprintf("%s (%v)", lock.Key, err))
	}
	st.Limit = ps.limit
	for _, p := range pairs {
		id, _ := strings.CutPrefix(p.Key, st.Name+"/")
		switch exclusive, held := ps.holders[p.Session]; {
		case p == lock:
		case strings.Contains(id, "/") || p.Flags != lock.Flags:
			st.Other = append(st.Other, p.Key)
		case p.Session == "": // a dead contender's key, pruned by the next write
		case held:
			st.Holders = append(st.Holders, permit(contender(p), p, st.Kind, true, exclusive))
		default:
			st.Waiters = append(st.Waiters, permit(contender(p), p, st.Kind, false, string(p.Value) == valWrite))
		}
	}
}

// permit describes ct, p's contender, of kind; held: p is a holder's;
// exclusive: in write mode.
func permit(ct holdfast.Contender, p *api.KVPair, kind holdfast.Kind, held, exclusive bool) holdfast.Contender {
	ct.Origin = holdfast.OriginHoldfast
	switch string(p.Value) {
	case valHeld, valHeldNext, valDowngraded:
		if held {
			ct.Token = holdfast.Token(p.ModifyIndex) // the write that admitted it
		}
	case valWait, valRead, valWrite:
	default:
		ct.Origin = holdfast.OriginNative
		if len(p.Value) > 0 {
			ct.Value = p.Value
		}
	}
	if kind == holdfast.KindRWMutex {
		ct.Mode = rwMode[exclusive]
	}
	return ct
}

// inspectClaim fills st from a claim's keys (ClaimFlags), if any: the
// record's period and token, and the run that holds the mark (an older
// holdfast's claim key too, its value as is).
func inspectClaim(st *holdfast.State, pairs api.KVPairs, contender func(*api.KVPair) holdfast.Contender) bool {
	record, run := st.Name+"/.claim", st.Name+"/.run"
	if !slices.ContainsFunc(pairs, func(p *api.KVPair) bool { return p.Flags == ClaimFlags && (p.Key == record || p.Key == run) }) {
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
