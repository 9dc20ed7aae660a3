#!/usr/bin/env bash
# scripts/mutants.sh: check that the test suite notices each safety guard's
# absence. For every guard listed in docs/GUARDS.md, build the code with that
# one guard removed (build tag holdfast_mutants, HOLDFAST_MUTANT=<guard>) and
# run the tests meant to catch it: they must FAIL. A guard whose removal
# passes the tests "survived", and the script exits 1.
#
# Usage: scripts/mutants.sh [guard ...]     (default: every guard)
set -uo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
if [ -z "${CONSUL_BIN:-}" ]; then CONSUL_BIN=$(./scripts/consul.sh) || exit 1; export CONSUL_BIN; fi

# guard | package | tests meant to catch it (a go test -run pattern)
# Only tests that catch the guard's absence every time are listed: the
# end-to-end deadline tests of the backends (etcd TestContextEndsAtDeadline,
# Consul TestGrantContextAtDeadline) race the timer and catch core/sync-deadline
# in most runs only.
table='
core/margin|./internal/core/|TestKeeperExpiresAtSentPlusTTLMinusMargin|TestGrantAccessors
core/margin|./tests/etcd/|TestPartitionedHolderToldFirst|TestConformanceOneNode/ToldBeforeNextGrant
core/margin|./cmd/holdfast/internal/safety/|TestSlowClockMargin
core/sync-deadline|./internal/core/|TestKeeperCheckIsSynchronous|TestGrantContextChecksDeadline
etcd/release-guard|./tests/etcd/|TestStaleUnlockLeavesNewerKey
etcd/release-guard|./cmd/holdfast/internal/safety/|TestHolderKeyDeleted
etcd/txn-guard|./tests/etcd/|TestGuardedTxnAfterUnnoticedDelete|TestGuardedTxn
etcd/txn-guard|./tests/leader/|TestManyFailoversEtcd
etcd/recheck-own-key|./tests/etcd/|TestWaiterKeyDeleted
etcd/recheck-own-key|./cmd/holdfast/internal/safety/|TestWaiterKeysDeleted
etcd/watch-now|./tests/etcd/|TestHandoffNoStall
etcd/semaphore-count|./tests/etcd/|TestSemaphoreCountsOnlyKeysAhead
etcd/semaphore-own-key|./tests/etcd/|TestSemaphoreWaiterKeyDeleted
etcd/semaphore-limit|./tests/etcd/|TestSemaphoreLimitMismatch
etcd/rw-downgrade-in-place|./tests/etcd/|TestRWMutexDowngradeKeepsWriterWaiting
etcd/rw-write-key-untouched|./tests/etcd/|TestRWMutexRecipeInterop
etcd/rw-marker-check|./tests/etcd/|TestRWMutexStaleMarker
etcd/proclaim-guard|./tests/etcd/|TestProclaimGuarded
consul/release-check-session|./consul/|TestKeyTakenOverNoticed|TestConformance/DeletedKey
consul/txn-check-session|./consul/|TestGuardedTxn
consul/proclaim-check-session|./consul/|TestProclaimGuarded
consul/handoff-check-next|./consul/|TestHandoffSkipsWaiterThatLeft|TestHandoffCancelRace
consul/session-watch|./consul/|TestSessionDestroyedNoticed|TestConformance/LossNotice
consul/key-check|./consul/|TestKeyDeletedNoticed|TestKeyTakenOverNoticed|TestStaleUnlockSameSession
consul/permit-cas|./consul/|TestSemaphoreStaleTryLock
consul/permit-release-check-session|./consul/|TestSemaphoreReleaseGuard
consul/permit-prune-dead-only|./consul/|TestSemaphoreBasic
consul/dead-semaphore-only|./consul/|TestDeadSemaphoreLockKey
consul/rwmutex-writer-alone|./consul/|TestRWMutexFIFO
core/multi-order|./internal/core/|TestMultiNames
core/multi-order|./tests/etcd/|TestMultiMutexFencedCounters|TestConformanceOneNode/MultiNoDeadlock
core/multi-order|./consul/|TestMultiMutexFencedCounters
etcd/multi-txn-guard|./tests/etcd/|TestMultiGuardedTxn
consul/multi-txn-check-session|./consul/|TestMultiGuardedTxn
cmd/kill-guard|./cmd/holdfast/|TestKill9StopsCommand
cmd/parent-death-signal|./cmd/holdfast/|TestKill9ParentDeathSignal
cmd/guard-deadline|./cmd/holdfast/|TestPausedHolderStopsCommand|TestDeadlineStopsCommand
cmd/term-grace|./cmd/holdfast/|TestShortPause
cmd/release-group|./cmd/holdfast/|TestReleaseStopsLeftovers
cmd/terminal|./cmd/holdfast/|TestTerminal/Read
etcd/claim-guard|./tests/etcd/|TestClaimGuardedTxn
consul/claim-check-session|./consul/|TestClaimGuardedTxn
etcd/claim-record|./tests/etcd/|TestClaimGuardedTxn|TestConformanceOneNode/ClaimLate
consul/claim-record|./consul/|TestClaimGuardedTxn|TestConformance/ClaimLate
etcd/claim-period-over|./tests/etcd/|TestClaimGuardedTxn
consul/claim-period-over|./consul/|TestClaimGuardedTxn
'

want=("$@")
survived=0
ran=0
while IFS='|' read -r guard pkg run; do
  [ -n "$guard" ] || continue
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" $guard "* ]]; then continue; fi
  ran=$((ran + 1))
  start=$(date +%s)
  log="/tmp/holdfast-mutant-${guard//\//_}-$(basename "$pkg").log"
  if HOLDFAST_MUTANT="$guard" go test -tags holdfast_mutants,holdfast_testhooks -count=1 -timeout 10m -run "$run" "$pkg" >"$log" 2>&1; then
    echo "SURVIVED  $guard  in $pkg ($pkg -run '$run' passed without it; log $log)"
    survived=$((survived + 1))
  elif grep -qE 'build failed|setup failed|panic:' "$log"; then
    echo "ERROR     $guard  in $pkg: the build or the test binary broke, which proves nothing (log $log)"
    survived=$((survived + 1))
  else
    caught=$(grep -E '^\s*--- FAIL' "$log" | sed 's/^ *--- FAIL: //; s/ (.*//' | head -4 | tr '\n' ' ')
    echo "caught    $guard  in $pkg, $(( $(date +%s) - start ))s, by: ${caught:-build or package failure (see $log)}"
  fi
done <<<"$table"
echo "mutants: $ran run, $survived survived"
[ "$survived" -eq 0 ] && [ "$ran" -gt 0 ]
