package etcd

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/core"
)

// mutexValue is the value of a Mutex's keys. concurrency.Mutex (and
// `etcdctl lock`) write an empty value, which it ignores, as holdfast
// ignores this one: it only tells Inspect who wrote the key.
const mutexValue = "holdfast lock"

// Inspect reads what etcd holds of name, writing nothing: the kind of
// primitive (from the keys' layout and values), its holders and waiters in
// order with their tokens, leases and time left, and whether holdfast or a
// native client (etcdctl lock, concurrency.Mutex, recipe.RWMutex) wrote each
// key. It costs one read of the keys under "<name>/" and one lease lookup
// per contender.
//
// Keys with an empty value written once are a lock's (as concurrency.Mutex
// writes them); keys with a value that holdfast's locks do not write are an
// election's candidates, whose value is the proposal: the leader's origin
// is unknown (holdfast's Election and concurrency.Election write the same
// key), while a waiting candidate with a proposal is concurrency.Election's
// (holdfast's waiting candidates write an empty value, see Election). A
// free name has no key: its kind is holdfast.KindUnknown. A claim's keys
// (see Once) give holdfast.KindClaim, its last period and the run, if any. Errors: an
// invalid name wraps holdfast.ErrInvalidName (before any request), a
// refused request holdfast.ErrPermissionDenied.
func Inspect(ctx context.Context, c *clientv3.Client, name string) (*holdfast.State, error) {
	if ctx == nil || c == nil {
		return nil, fmt.Errorf("%w: nil context or client", holdfast.ErrInvalidArgument)
	}
	if err := holdfast.ValidateName(name); err != nil {
		return nil, err
	}
	pfx := name + "/"
	resp, err := c.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("holdfast/etcd: inspect %s: %w", name, storeErr(err))
	}
	st := &holdfast.State{Name: name, Index: uint64(resp.Header.Revision)}
	var queue, rw, claim []*mvccpb.KeyValue
	var marker *mvccpb.KeyValue
	for _, kv := range resp.Kvs {
		rest := string(kv.Key[len(pfx):])
		mode, id, _ := strings.Cut(rest, "/")
		switch {
		case rest == ".claim" || rest == ".run":
			claim = append(claim, kv)
		case rest == ".down":
			marker = kv
		case (mode == "read" || mode == "write") && id != "" && !strings.Contains(id, "/") && kv.Lease != 0:
			rw = append(rw, kv)
		case !strings.Contains(rest, "/") && kv.Lease != 0:
			queue = append(queue, kv)
		default:
			st.Other = append(st.Other, string(kv.Key))
		}
	}
	leases := map[int64]*clientv3.LeaseTimeToLiveResponse{}
	contender := func(kv *mvccpb.KeyValue) holdfast.Contender {
		ct := holdfast.Contender{Key: string(kv.Key), Session: fmt.Sprintf("%x", kv.Lease), Left: -1}
		l, ok := leases[kv.Lease]
		if !ok {
			l, _ = c.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)) // nil: unknown
			leases[kv.Lease] = l
		}
		if l != nil {
			ct.TTL = time.Duration(l.GrantedTTL) * time.Second
			ct.Left = time.Duration(max(l.TTL, 0)) * time.Second
		}
		return ct
	}
	if len(claim) > 0 {
		inspectClaim(st, claim, contender)
		for _, kv := range append(queue, rw...) {
			st.Other = append(st.Other, string(kv.Key))
		}
		return st, nil
	}
	if len(rw) > 0 {
		inspectRW(st, rw, marker, contender)
		for _, kv := range queue {
			st.Other = append(st.Other, string(kv.Key))
		}
		return st, nil
	}
	if marker != nil {
		st.Other = append(st.Other, string(marker.Key))
	}
	st.Kind = holdfast.KindLock
	for _, kv := range queue {
		if l, ok := strings.CutPrefix(string(kv.Value), semValuePrefix+"limit="); ok {
			st.Kind = holdfast.KindSemaphore
			if n, err := strconv.Atoi(l); err == nil && st.Limit == 0 {
				st.Limit = n
			}
			break
		}
		if v := string(kv.Value); v != "" && v != mutexValue || v == "" && kv.Version > 1 {
			st.Kind = holdfast.KindElection // a proposal, or a leader's empty one (see inOffice)
		}
	}
	if len(queue) == 0 {
		st.Kind = holdfast.KindUnknown
	}
	for i, kv := range queue {
		ct := contender(kv)
		switch v := string(kv.Value); {
		case strings.HasPrefix(v, semValuePrefix), v == mutexValue:
			ct.Origin = holdfast.OriginHoldfast
		case st.Kind == holdfast.KindElection && v == "":
			// holdfast's candidate: its key is empty until it takes office
			// (or it took office with an empty proposal)
			ct.Origin = holdfast.OriginHoldfast
		case v == "":
			ct.Origin = holdfast.OriginNative // etcdctl lock, concurrency.Mutex
		case i > 0:
			// a waiting candidate with its proposal: concurrency.Election's
			// (holdfast writes its proposal once first)
			ct.Origin, ct.Value = holdfast.OriginNative, kv.Value
		default:
			ct.Value = kv.Value // the leader's proposal: holdfast's or concurrency.Election's
		}
		holds := i < max(st.Limit, 1)
		if st.Kind == holdfast.KindElection && !inOffice(kv) {
			holds = false // the first candidate has not taken office: no leader (see Election)
		}
		if holds {
			ct.Token = holdfast.Token(kv.CreateRevision)
			st.Holders = append(st.Holders, ct)
		} else {
			st.Waiters = append(st.Waiters, ct)
		}
	}
	return st, nil
}

// inspectClaim fills st from a claim's keys (see Once): the record's
// period and token, and the run that holds the mark, if any. A claim key
// of an older holdfast (leased, JSON) is shown as the holder, its value
// as is.
func inspectClaim(st *holdfast.State, keys []*mvccpb.KeyValue, contender func(*mvccpb.KeyValue) holdfast.Contender) {
	st.Kind = holdfast.KindClaim
	for _, kv := range keys {
		if p, ok := core.ParsePeriod(kv.Value); ok && kv.Lease == 0 {
			st.Period, st.PeriodToken = p, holdfast.Token(kv.ModRevision)
			continue
		}
		ct := contender(kv)
		ct.Origin, ct.Token = holdfast.OriginHoldfast, holdfast.Token(kv.CreateRevision)
		if _, ok := core.ParsePeriod(kv.Value); !ok {
			ct.Value = kv.Value
		}
		st.Holders = append(st.Holders, ct)
	}
}

// inspectRW fills st from a read-write lock's keys (see RWMutex), by create
// revision: a writer holds if no key is older, a reader if no write key is
// older but the downgraded one that marker names.
func inspectRW(st *holdfast.State, keys []*mvccpb.KeyValue, marker *mvccpb.KeyValue, contender func(*mvccpb.KeyValue) holdfast.Contender) {
	st.Kind = holdfast.KindRWMutex
	var downKey string
	var downRev int64
	if marker != nil {
		downKey, downRev, _ = parseMarker(marker.Value)
	}
	writerAhead := false
	for i, kv := range keys {
		ct := contender(kv)
		mode, id, _ := strings.Cut(string(kv.Key[len(st.Name)+1:]), "/")
		ct.Origin = holdfast.OriginNative // recipe.RWMutex: a timestamp, not the lease
		if id == fmt.Sprintf("%x", kv.Lease) {
			ct.Origin = holdfast.OriginHoldfast
		}
		if len(kv.Value) > 0 {
			ct.Value = kv.Value
		}
		downgraded := mode == "write" && string(kv.Key) == downKey && kv.CreateRevision == downRev
		if downgraded {
			mode = "read"
		}
		ct.Mode = mode
		holds := !writerAhead && (mode == "read" || i == 0)
		if mode == "write" {
			writerAhead = true
		}
		if holds {
			ct.Token = holdfast.Token(kv.CreateRevision)
			st.Holders = append(st.Holders, ct)
		} else {
			st.Waiters = append(st.Waiters, ct)
		}
	}
}
