package consul

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/holdfast/holdfast/internal/core"
)

// maxDropDead bounds how many stale queue entries one request removes.
const maxDropDead = 64

// blockTimeout is the client-side timeout of a blocking query with the given
// wait time: Consul adds up to wait/16 of jitter.
func blockTimeout(wait time.Duration) time.Duration { return wait + wait/16 + 2*time.Second }

// queryRefused reports whether a blocking query was refused (HTTP 4xx: an
// ACL, a bad request): retrying cannot change that.
func queryRefused(err error) bool { code := statusCode(err); return code >= 400 && code < 500 }

// block repeats query, a blocking query waiting at most blockWait (less if
// bound > 0 ends sooner), until it reports a change. It returns true then,
// and false, nil once bound > 0 has passed without one. Timeouts and
// transport errors are retried (core.Backoff) until ctx ends (with the
// session, if the store stays unreachable); a refusal is an error.
func (s *Session) block(ctx context.Context, what string, bound time.Duration, query func(*api.QueryOptions) (bool, error)) (bool, error) {
	start := time.Now()
	for {
		w := blockWait
		if bound > 0 {
			if w = min(w, bound-time.Since(start)); w <= 0 {
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

// watchKey blocks until key's ModifyIndex is no longer index (it changed or
// is gone), and returns the key as it then is (nil if gone); with bound > 0
// it returns nil, nil once bound has passed without a change (see block).
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

// watchTree blocks until the index of the subtree under prefix is no longer
// index (something under it changed), and returns its keys and new index;
// with bound > 0 it returns nil, index, nil once bound has passed without a
// change (see block).
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

// dropDead deletes keys whose session is gone (queue entries with their
// subtrees, contender keys, left by sessions with Behavior release), at most
// maxDropDead at a time, and wakes the waiters whose links or anchors lay
// under a gone entry (see appendWake). Nobody may read them again: a request
// that gets no answer is retried in the session's background while it
// lives; a failed check-and-set means they were dropped already.
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
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	err := drop(rctx)
	cancel()
	if err != nil {
		s.bg.Go(func(ctx context.Context) { _ = core.Retry(ctx, drop) })
	}
}
