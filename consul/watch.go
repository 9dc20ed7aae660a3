package consul

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/internal/core"
)

// maxDropDead bounds how many dead keys one request removes.
const maxDropDead = 64

// get reads key within requestTimeout (nil: absent), consistently if
// consistent.
func (s *Session) get(ctx context.Context, key string, consistent bool) (*api.KVPair, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	e, _, err := s.client.KV().Get(key, (&api.QueryOptions{RequireConsistent: consistent}).WithContext(ctx))
	if err != nil {
		return nil, apiError("read "+key, err)
	}
	return e, nil
}

// blockTimeout bounds a blocking query of wait (Consul adds up to wait/16).
func blockTimeout(wait time.Duration) time.Duration { return wait + wait/16 + 2*time.Second }

// queryRefused reports whether a query was refused (HTTP 4xx: an ACL, a
// bad request): retrying cannot change that.
func queryRefused(err error) bool { return statusCode(err)/100 == 4 }

// block repeats query, a blocking query of at most blockWait (and bound,
// if > 0), until it reports a change: true; false, nil once bound passed.
// Timeouts and transport errors are retried (core.Backoff) until ctx ends;
// a refusal is an error.
func (s *Session) block(ctx context.Context, what string, bound time.Duration, query func(*api.QueryOptions) (bool, error)) (bool, error) {
	start := time.Now()
	for {
		w := blockWait
		if bound > 0 {
			w = min(w, bound-time.Since(start))
			if w <= 0 {
				return false, nil
			}
		}
		var changed bool
		err := core.Backoff{Attempt: blockTimeout(w), Final: queryRefused}.Retry(ctx, func(ctx context.Context) (err error) {
			changed, err = query((&api.QueryOptions{WaitTime: w}).WithContext(ctx))
			return err
		})
		switch {
		case ctx.Err() != nil:
			return false, ctx.Err()
		case err != nil:
			return false, apiError(what, err)
		case changed:
			return true, nil
		}
	}
}

// watchKey blocks until key's ModifyIndex is no longer index, and returns
// the key (nil if gone); nil, nil once bound > 0 passed (see block).
func (s *Session) watchKey(ctx context.Context, key string, index uint64, bound time.Duration) (*api.KVPair, error) {
	var pair *api.KVPair
	wait := index
	changed, err := s.block(ctx, "watch "+key, bound, func(q *api.QueryOptions) (bool, error) {
		q.WaitIndex = wait
		p, meta, err := s.client.KV().Get(key, q)
		if err != nil {
			return false, err
		}
		pair, wait = p, max(meta.LastIndex, index)
		return p == nil || p.ModifyIndex != index, nil
	})
	if err != nil || !changed {
		return nil, err
	}
	return pair, nil
}

// watchTree blocks until the index of the subtree under prefix is no
// longer index, and returns its keys and new index; nil, index, nil once
// bound > 0 passed (see block).
func (s *Session) watchTree(ctx context.Context, prefix string, index uint64, bound time.Duration) (api.KVPairs, uint64, error) {
	var pairs api.KVPairs
	last := index
	changed, err := s.block(ctx, "watch "+prefix, bound, func(q *api.QueryOptions) (bool, error) {
		q.WaitIndex = index
		p, meta, err := s.client.KV().List(prefix, q)
		if err != nil {
			return false, err
		}
		pairs, last = p, meta.LastIndex
		return last != index, nil
	})
	switch {
	case err != nil:
		return nil, 0, err
	case !changed:
		return nil, index, nil
	}
	return pairs, last, nil
}

// dropDead deletes keys whose session is gone (at most maxDropDead: queue
// entries with their subtrees, contender keys) and wakes the waiters linked
// under a gone entry (appendWake); a request without answer is retried in
// the session's background, and a failed check means they went already.
func (s *Session) dropDead(ctx context.Context, dead []*api.KVPair) {
	if len(dead) == 0 {
		return
	}
	dead = dead[:min(len(dead), maxDropDead)]
	ops := make(api.TxnOps, 0, 2*len(dead))
	for _, e := range dead {
		ops = append(ops, deleteCAS(e.Key, e.ModifyIndex))
		if i := strings.Index(e.Key, queueInfix); i >= 0 && !strings.Contains(e.Key[i+len(queueInfix):], "/") {
			ops = append(ops, kvOp(api.KVDeleteTree, e.Key+"/")) // a queue entry's links and marks
		} else {
			ops = appendWake(ops, e) // a link or anchor under a gone entry: wake its waiter
		}
	}
	drop := func(ctx context.Context) error {
		_, err := s.txn(ctx, ops)
		var rb *rollback
		if errors.As(err, &rb) {
			return nil
		}
		return err
	}
	if err := drop(ctx); err != nil {
		s.bg.Go(func(ctx context.Context) { _ = core.Retry(ctx, drop) })
	}
}
