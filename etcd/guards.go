//go:build !holdfast_mutants

package etcd

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The guards of the etcd backend (docs/GUARDS.md), as the algorithms use
// them. The build with the tag holdfast_mutants can remove each one (see
// guards_mutants.go); a normal build pays nothing for that.

// releaseGuard is the compare of a release: our key still has our create
// revision (guard etcd/release-guard).
func releaseGuard(g *Grant) []clientv3.Cmp { return []clientv3.Cmp{g.Guard()} }

// txnGuard is the compare of Grant.Txn (guard etcd/txn-guard).
func txnGuard(g *Grant) []clientv3.Cmp { return []clientv3.Cmp{g.Guard()} }

// proclaimGuard is the compare of Election.Proclaim (guard
// etcd/proclaim-guard).
func proclaimGuard(g *Grant) []clientv3.Cmp { return []clientv3.Cmp{g.Guard()} }

// claimGuard is the compare of Claim.Txn: the claim key carries the
// claim's lease (guard etcd/claim-guard).
func claimGuard(c *Claim) []clientv3.Cmp { return []clientv3.Cmp{c.Guard()} }

// claimRecordGuard is the compare that lets a claim of period p (the
// record's value format) write the record: the recorded period is older
// (guard etcd/claim-record).
func claimRecordGuard(record, p string) []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.Value(record), "<", p)}
}

// claimPeriodOver reports whether a claim of period, made at now, came
// after the period's end: it must not run (guard etcd/claim-period-over).
func claimPeriodOver(period time.Time, every time.Duration, now time.Time) bool {
	return !now.Before(period.Add(every))
}

// multiPartGuard is part p's compare in MultiGrant.Txn (guard
// etcd/multi-txn-guard).
func multiPartGuard(p *Grant, last bool) []clientv3.Cmp { return []clientv3.Cmp{p.Guard()} }

// ownKeyGuard is the compare of a waiter's requests after its join: key
// still has create revision rev (guard etcd/recheck-own-key).
func ownKeyGuard(key string, rev int64) []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", rev)}
}

// predWatch is the option of a FIFO waiter's watch of its predecessor:
// from the server's current revision, so that a deletion between the read
// and the watch is reported (guard etcd/watch-now).
func predWatch(seen int64) clientv3.OpOption { return clientv3.WithCreatedNotify() }

// ownKeyDeleted reports whether ev deletes key, a counting waiter's own
// (guard etcd/semaphore-own-key).
func ownKeyDeleted(ev *clientv3.Event, key string) bool {
	return string(ev.Kv.Key) == key && ev.Type == mvccpb.DELETE
}

// limitGuard is the compare of a semaphore's join: every key under pfx
// carries the same value, the limit (guard etcd/semaphore-limit).
func limitGuard(pfx, value string) []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.Value(pfx), "=", value).WithPrefix()}
}

// limitMismatch reports whether kv carries another limit than value
// (guard etcd/semaphore-limit).
func limitMismatch(kv *mvccpb.KeyValue, value string) bool { return string(kv.Value) != value }

// wasAhead reports whether a deleted key (its previous state prev) was ahead
// of our key, created at rev (guard etcd/semaphore-count).
func wasAhead(prev *mvccpb.KeyValue, rev int64) bool { return prev.CreateRevision < rev }

// downgrade is RWMutex.Downgrade's write: in place, keeping the write key
// and its create revision (guard etcd/rw-downgrade-in-place).
func (rw *RWMutex) downgrade(ctx context.Context, w *Grant) (*Grant, error) {
	return rw.downgradeInPlace(ctx, w)
}

// touchWriteKey is what Downgrade writes on w's key: nothing, so that its
// mod revision tells nobody anything (guard etcd/rw-write-key-untouched).
func touchWriteKey(w *Grant, lease clientv3.LeaseID) []clientv3.Op { return nil }

// marks reports whether write key kv is the one the downgrade marker
// names, key at create revision rev (guard etcd/rw-marker-check).
func marks(kv *mvccpb.KeyValue, key string, rev int64) bool {
	return string(kv.Key) == key && kv.CreateRevision == rev
}
