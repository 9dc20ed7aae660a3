#!/usr/bin/env bash
# scripts/mutants.sh: check that the test suite notices each safety guard's
# absence. For every guard listed in docs/GUARDS.md, build the code with that
# one guard removed (build tag holdfast_mutants, HOLDFAST_MUTANT=<guard>) and
# run the tests meant to catch it: they must FAIL. A guard whose removal
# passes the tests "survived", and the script exits 1.
#
# Each package's test binary is built once (the guard is chosen at run time,
# by HOLDFAST_MUTANT), then the rows run MUTANT_JOBS at a time (default 2:
# their tests mostly wait on timers and TTLs).
#
# Usage: scripts/mutants.sh [guard ...]     (default: every guard)
set -uo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
if [ -z "${CONSUL_BIN:-}" ]; then CONSUL_BIN=$(./scripts/consul.sh) || exit 1; export CONSUL_BIN; fi
jobs_max=${MUTANT_JOBS:-2}

# guard | package | tests meant to catch it (a go test -run pattern)
# Only tests that catch the guard's absence every time are listed, and of
# those only what is needed: one subtest where any of them catches it, and
# not the slower of two tests that both wait for a deadlock's 30 s timeout.
# The end-to-end deadline tests of the backends (etcd TestContextEndsAtDeadline,
# Consul TestGrantContextAtDeadline) race the timer and catch core/sync-deadline
# in most runs only. The scenarios of cmd/holdfast/internal/safety that catch
# core/margin, etcd/release-guard and etcd/recheck-own-key (TestSlowClockMargin,
# TestHolderKeyDeleted, TestWaiterKeysDeleted) are not rows here: its
# TestBrokenVariants, part of `make test`, builds them with each of these
# guards removed and checks that each fails on its checker.
table='
core/margin|./internal/core/|TestKeeperExpiresAtSentPlusTTLMinusMargin|TestGrantAccessors
core/margin|./tests/etcd/|TestPartitionedHolderToldFirst|TestConformanceOneNode/ToldBeforeNextGrant
core/sync-deadline|./internal/core/|TestKeeperCheckIsSynchronous|TestGrantContextChecksDeadline
etcd/release-guard|./tests/etcd/|TestStaleUnlockLeavesNewerKey
etcd/txn-guard|./tests/etcd/|TestGuardedTxnAfterUnnoticedDelete|TestGuardedTxn
etcd/txn-guard|./tests/leader/|TestManyFailoversEtcd
etcd/recheck-own-key|./tests/etcd/|TestWaiterKeyDeleted
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
core/multi-order|./tests/etcd/|TestMultiMutexFencedCounters
core/multi-order|./consul/|TestMultiMutexFencedCounters
etcd/multi-txn-guard|./tests/etcd/|TestMultiGuardedTxn
consul/multi-txn-check-session|./consul/|TestMultiGuardedTxn
cmd/kill-guard|./cmd/holdfast/|TestKill9StopsCommand/etcd/lock$
cmd/parent-death-signal|./cmd/holdfast/|TestKill9ParentDeathSignal
cmd/guard-deadline|./cmd/holdfast/|TestPausedHolderStopsCommand|TestDeadlineStopsCommand
cmd/term-grace|./cmd/holdfast/|TestShortPause
cmd/release-group|./cmd/holdfast/|TestReleaseStopsLeftovers
cmd/terminal|./cmd/holdfast/|TestTerminal/Read
cmd/shard-kill-grace|./cmd/holdfast/|TestShardKillGrace
cmd/guard-first-deadline|./cmd/holdfast/|TestGuardFirstDeadlineUnfed
cmd/shim-gate|./cmd/holdfast/|TestShimGate
cmd/signal-escalation|./cmd/holdfast/|TestSignalStopsStoppedCommand
cmd/guard-gone|./cmd/holdfast/|TestGuardGone
cmd/tstp-withdraw|./cmd/holdfast/|TestStopWhileWaiting$
cmd/tstp-await-cont|./cmd/holdfast/|TestStopWhileWaitingLong
etcd/claim-guard|./tests/etcd/|TestClaimGuardedTxn
consul/claim-check-session|./consul/|TestClaimGuardedTxn
etcd/claim-record|./tests/etcd/|TestClaimGuardedTxn|TestConformanceOneNode/ClaimLate
consul/claim-record|./consul/|TestClaimGuardedTxn|TestConformance/ClaimLate
etcd/claim-period-over|./tests/etcd/|TestClaimGuardedTxn
consul/claim-period-over|./consul/|TestClaimGuardedTxn
'

want=("$@")
rows=()
while IFS='|' read -r guard pkg run; do
  [ -n "$guard" ] || continue
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" $guard "* ]]; then continue; fi
  rows+=("$guard|$pkg|$run")
done <<<"$table"

work=$(mktemp -d /tmp/holdfast-mutants.XXXXXX)
trap 'rm -rf "$work"' EXIT
# One test binary per package, with the mutants compiled in (and off until
# HOLDFAST_MUTANT names one), built by one go test -c (as <name>.test: the
# packages' last elements differ); and the command, for cmd/holdfast's tests
# (holdfastBin), built at the same time.
declare -A bin
pkgs=()
for row in "${rows[@]}"; do
  IFS='|' read -r guard pkg run <<<"$row"
  [[ " ${pkgs[*]} " == *" $pkg "* ]] || pkgs+=("$pkg")
done
cmdpid=
if [[ " ${pkgs[*]} " == *" ./cmd/holdfast/ "* ]]; then
  (cd cmd/holdfast && go build -tags holdfast_mutants -o "$work/holdfast" .) >/tmp/holdfast-mutant-build-cmd.log 2>&1 &
  cmdpid=$!
fi
mkdir "$work/bin"
log=/tmp/holdfast-mutant-build.log
go test -c -tags holdfast_mutants,holdfast_testhooks -o "$work/bin/" "${pkgs[@]}" >"$log" 2>&1
for pkg in "${pkgs[@]}"; do
  b="$work/bin/$(basename "$pkg").test"
  if [ -x "$b" ]; then
    bin[$pkg]=$b
  else
    bin[$pkg]=none
    echo "ERROR     building $pkg with the mutants failed, which proves nothing (log $log)"
  fi
done
if [ -n "$cmdpid" ]; then
  if wait "$cmdpid"; then
    export HOLDFAST_TEST_BIN="$work/holdfast"
  else
    echo "ERROR     building the command with the mutants failed (log /tmp/holdfast-mutant-build-cmd.log)"
    bin[./cmd/holdfast/]=none
  fi
fi

# one runs row $1 (guard|package|pattern) and writes its verdict to
# $work/verdict.$2: caught, or survived (which counts an error too).
one() {
  local guard pkg run
  IFS='|' read -r guard pkg run <<<"$1"
  local start log b caught
  start=$(date +%s)
  log="/tmp/holdfast-mutant-${guard//\//_}-$(basename "$pkg").log"
  b=${bin[$pkg]}
  if [ "$b" = none ]; then
    echo "ERROR     $guard  in $pkg: no test binary (see the build log above)"
    echo survived >"$work/verdict.$2"
    return
  fi
  # As go test runs it: in the package's directory.
  if (cd "$pkg" && HOLDFAST_MUTANT="$guard" "$b" -test.count=1 -test.timeout=10m -test.run "$run") >"$log" 2>&1; then
    echo "SURVIVED  $guard  in $pkg ($pkg -run '$run' passed without it; log $log)"
    echo survived >"$work/verdict.$2"
  elif grep -qE 'setup failed|panic:' "$log"; then
    echo "ERROR     $guard  in $pkg: the test binary broke, which proves nothing (log $log)"
    echo survived >"$work/verdict.$2"
  else
    caught=$(grep -E '^\s*--- FAIL' "$log" | sed 's/^ *--- FAIL: //; s/ (.*//' | head -4 | tr '\n' ' ')
    echo "caught    $guard  in $pkg, $(( $(date +%s) - start ))s, by: ${caught:-package failure (see $log)}"
    echo caught >"$work/verdict.$2"
  fi
}

i=0
for row in "${rows[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  one "$row" "$i" &
  i=$((i + 1))
done
wait
ran=${#rows[@]}
caught=$(cat "$work"/verdict.* 2>/dev/null | grep -c '^caught$')
survived=$((ran - caught))
echo "mutants: $ran run, $survived survived"
[ "$survived" -eq 0 ] && [ "$ran" -gt 0 ]
