//go:build holdfast_mutants

package etcd

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/internal/mutant"
)

// The guards of guards.go, each removable by HOLDFAST_MUTANT (see
// internal/mutant and docs/GUARDS.md).

func releaseGuard(g *Grant) []clientv3.Cmp {
	if mutant.On("etcd/release-guard") {
		return nil
	}
	return []clientv3.Cmp{g.Guard()}
}

func txnGuard(g *Grant) []clientv3.Cmp {
	if mutant.On("etcd/txn-guard") {
		return nil
	}
	return []clientv3.Cmp{g.Guard()}
}

func proclaimGuard(g *Grant) []clientv3.Cmp {
	if mutant.On("etcd/proclaim-guard") {
		return nil
	}
	return []clientv3.Cmp{g.Guard()}
}

func claimGuard(c *Claim) []clientv3.Cmp {
	if mutant.On("etcd/claim-guard") {
		return nil
	}
	return []clientv3.Cmp{c.Guard()}
}

func claimRecordGuard(record, p string) []clientv3.Cmp {
	if mutant.On("etcd/claim-record") {
		return nil
	}
	return []clientv3.Cmp{clientv3.Compare(clientv3.Value(record), "<", p)}
}

func claimPeriodOver(period time.Time, every time.Duration, now time.Time) bool {
	if mutant.On("etcd/claim-period-over") {
		return false
	}
	return !now.Before(period.Add(every))
}

func multiPartGuard(p *Grant, last bool) []clientv3.Cmp {
	if last && mutant.On("etcd/multi-txn-guard") {
		return nil // the last part unguarded
	}
	return []clientv3.Cmp{p.Guard()}
}

func ownKeyGuard(key string, rev int64) []clientv3.Cmp {
	if mutant.On("etcd/recheck-own-key") {
		return nil
	}
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", rev)}
}

func predWatch(seen int64) clientv3.OpOption {
	if mutant.On("etcd/watch-now") {
		return clientv3.WithRev(seen) // as concurrency.Mutex does
	}
	return clientv3.WithCreatedNotify()
}

func ownKeyDeleted(ev *clientv3.Event, key string) bool {
	return string(ev.Kv.Key) == key && ev.Type == mvccpb.DELETE && !mutant.On("etcd/semaphore-own-key")
}

func limitGuard(pfx, value string) []clientv3.Cmp {
	if mutant.On("etcd/semaphore-limit") {
		return nil
	}
	return []clientv3.Cmp{clientv3.Compare(clientv3.Value(pfx), "=", value).WithPrefix()}
}

func limitMismatch(kv *mvccpb.KeyValue, value string) bool {
	return string(kv.Value) != value && !mutant.On("etcd/semaphore-limit")
}

func wasAhead(prev *mvccpb.KeyValue, rev int64) bool {
	return prev.CreateRevision < rev || mutant.On("etcd/semaphore-count")
}

func (rw *RWMutex) downgrade(ctx context.Context, w *Grant) (*Grant, error) {
	if mutant.On("etcd/rw-downgrade-in-place") {
		return rw.downgradeByNewKey(ctx, w)
	}
	return rw.downgradeInPlace(ctx, w)
}

// downgradeByNewKey is the unsafe downgrade that the etcd/rw-downgrade-in-place
// guard rules out: the write key is replaced by a new read key, whose create
// revision is newer than the writers queued behind, which stop waiting.
func (rw *RWMutex) downgradeByNewKey(ctx context.Context, w *Grant) (*Grant, error) {
	s := rw.rq.s
	resp, err := s.client.Txn(ctx).If(w.Guard()).Then(clientv3.OpDelete(w.Key()), clientv3.OpPut(rw.rq.key, "", clientv3.WithLease(s.lease))).Commit()
	if err != nil || !resp.Succeeded {
		w.free()
		return nil, fmt.Errorf("%w: downgrade failed: %v", holdfast.ErrNotHeld, err)
	}
	return newGrant(s, w.pfx, rw.rq.key, resp.Header.Revision, resp.Header.Revision, w.free, nil), nil
}

func touchWriteKey(w *Grant, lease clientv3.LeaseID) []clientv3.Op {
	if mutant.On("etcd/rw-write-key-untouched") {
		// Mark the write key itself: same create revision, newer mod revision.
		return []clientv3.Op{clientv3.OpPut(w.Key(), "", clientv3.WithLease(lease))}
	}
	return nil
}

func marks(kv *mvccpb.KeyValue, key string, rev int64) bool {
	return string(kv.Key) == key && kv.CreateRevision == rev || mutant.On("etcd/rw-marker-check")
}
