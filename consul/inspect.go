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
	st := &holdfast.State{Name: name, Index: meta.LastIndex}
	in := &inspector{ctx: ctx, c: c, sessions: map[string]*api.SessionEntry{}}
	if inspectClaim(st, pairs, in) {
		return st, nil
	}
	i := slices.IndexFunc(pairs, func(p *api.KVPair) bool { return p.Key == LockKey(name) })
	switch {
	case i < 0:
		inspectLock(st, nil, pairs, in)
	case pairs[i].Flags == api.SemaphoreFlagValue || pairs[i].Flags == RWMutexFlagValue:
		inspectPermits(st, pairs[i], pairs, in)
	default:
		inspectLock(st, pairs[i], pairs, in)
	}
	return st, nil
}

// inspector describes contenders, looking up each session once.
type inspector struct {
	ctx      context.Context
	c        *api.Client
	sessions map[string]*api.SessionEntry // nil: unknown
}

// contender describes p, a key held by a session.
func (in *inspector) contender(p *api.KVPair) holdfast.Contender {
	ct := holdfast.Contender{Key: p.Key, Session: p.Session, Left: -1}
	s, ok := in.sessions[p.Session]
	if !ok {
		s, _, _ = in.c.Session().Info(p.Session, (&api.QueryOptions{}).WithContext(in.ctx))
		in.sessions[p.Session] = s
	}
	if s != nil {
		ct.TTL, _ = time.ParseDuration(s.TTL)
		ct.LockDelay = s.LockDelay
	}
	return ct
}

// inspectLock fills st from a lock's or an election's keys: the lock key
// (nil if absent), and holdfast's queue in order.
func inspectLock(st *holdfast.State, lock *api.KVPair, pairs api.KVPairs, in *inspector) {
	queuePrefix, tailKey := st.Name+queueInfix, st.Name+tailSuffix
	var queue []*api.KVPair
	for _, p := range pairs {
		switch id, inQueue := strings.CutPrefix(p.Key, queuePrefix); {
		case p == lock && p.Flags == api.LockFlagValue, p.Key == tailKey:
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
		ct := holdfast.Contender{Origin: holdfast.OriginHoldfast, Token: holdfast.Token(tokenOf(lock))}
		switch v := string(lock.Value); {
		case strings.HasPrefix(v, valueTaken):
		case v == "":
			ct.Origin = holdfast.OriginNative
		default:
			st.Kind = holdfast.KindElection
			ct.Origin, ct.Value, ct.Token = holdfast.OriginUnknown, lock.Value, leaderOf(lock).Term
		}
		if lock.Session != "" {
			h := in.contender(lock)
			h.Origin, h.Value, h.Token = ct.Origin, ct.Value, ct.Token
			st.Holders = append(st.Holders, h)
		}
	}
	slices.SortFunc(queue, byArrival)
	for _, p := range queue {
		w := in.contender(p)
		w.Origin = holdfast.OriginHoldfast
		st.Waiters = append(st.Waiters, w)
	}
}

// byArrival orders keys by CreateIndex.
func byArrival(a, b *api.KVPair) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) }

// inspectPermits fills st from a semaphore's or a read-write lock's keys:
// the holders the lock key names, then the other live contenders, each by
// arrival.
func inspectPermits(st *holdfast.State, lock *api.KVPair, pairs api.KVPairs, in *inspector) {
	st.Kind = holdfast.KindSemaphore
	ps, err := decodeSemaphoreLock(lock.Value, 0)
	if lock.Flags == RWMutexFlagValue {
		st.Kind = holdfast.KindRWMutex
		ps, err = decodeRWLock(lock.Value)
	}
	if err != nil {
		st.Other = append(st.Other, fmt.Sprintf("%s (%v)", lock.Key, err))
	}
	st.Limit = ps.limit
	var holders, waiters []*api.KVPair
	for _, p := range pairs {
		id, _ := strings.CutPrefix(p.Key, st.Name+"/")
		switch _, held := ps.holders[p.Session]; {
		case p == lock:
		case strings.Contains(id, "/") || p.Flags != lock.Flags:
			st.Other = append(st.Other, p.Key)
		case p.Session == "":
			// a dead contender's key, pruned by the next write
		case held:
			holders = append(holders, p)
		default:
			waiters = append(waiters, p)
		}
	}
	slices.SortFunc(holders, byArrival)
	slices.SortFunc(waiters, byArrival)
	for _, p := range holders {
		st.Holders = append(st.Holders, in.permit(p, ps, st.Kind, true))
	}
	for _, p := range waiters {
		st.Waiters = append(st.Waiters, in.permit(p, ps, st.Kind, false))
	}
}

// permit describes p, a contender key of a kind whose lock key says ps.
func (in *inspector) permit(p *api.KVPair, ps permitState, kind holdfast.Kind, held bool) holdfast.Contender {
	ct := in.contender(p)
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
	if kind == holdfast.KindRWMutex {
		ct.Mode = "read"
		if exclusive, ok := ps.holders[p.Session]; ok && exclusive || !ok && string(p.Value) == valWrite {
			ct.Mode = "write"
		}
	}
	return ct
}

// inspectClaim fills st from a claim's keys (ClaimFlags), if any: the
// record's period and token, and the run that holds the mark (an older
// holdfast's claim key too, its value as is).
func inspectClaim(st *holdfast.State, pairs api.KVPairs, in *inspector) bool {
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
			ct := in.contender(p)
			ct.Origin, ct.Token = holdfast.OriginHoldfast, holdfast.Token(p.ModifyIndex)
			if _, ok := core.ParsePeriod(p.Value); !ok {
				ct.Value = p.Value
			}
			st.Holders = append(st.Holders, ct)
		}
	}
	return true
}
