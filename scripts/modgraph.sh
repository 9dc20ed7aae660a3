#!/usr/bin/env bash
# scripts/modgraph.sh: what a user's module inherits from the library.
#
# 1. A fresh module outside the repository imports every package of the
#    library (the root contract, etcd, consul, semaphore, leader, metrics,
#    fence/sqlfence) through a replace onto this checkout, runs go mod tidy
#    and go build: `go list -m all` must name none of the modules of the
#    plots, the safety suite or the command (HEAVY below). gonum.org/v1/gonum
#    is not among them: grpc's own go.mod requires it, so every user of the
#    etcd client lists it.
#    PENDING (issue 19): go.etcd.io/etcd/server/v3 and pgx still appear. Not
#    through the library's packages but through their tests: go mod tidy in
#    the user's module loads the tests of every package it imports (one level
#    deep) and records the modules those import, and the tests of etcd,
#    consul, leader, semaphore, metrics, fence/sqlfence and the root import
#    embedtest, which imports the embedded etcd server and pgx. Making them
#    disappear takes those tests out of the library's packages (etcd's own
#    layout: client/v3 tests against a server live in the tests/ module) or
#    an embedtest that runs etcd as a separate process. The script prints
#    them and fails only on HEAVY, so the day they go, move them into HEAVY.
# 2. The same module importing embedtest too (a user's own tests) gets the
#    servers: etcd/server and pgx must appear then.
# 3. Every go.mod of the repository is a module of go.work and of the
#    Makefile's MODULES, so lint and tests cover it.
# It prints the module counts. Exits 1, naming the culprits, otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod
HEAVY='^(gonum\.org/v1/plot|github\.com/spf13/cobra|github\.com/anishathalye/porcupine|codeberg\.org/go-latex/latex) '
PENDING='^(go\.etcd\.io/etcd/server/v3|github\.com/jackc/pgx/v5) '

fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

usermod() { # dir, extra import lines...
  local d=$1; shift
  mkdir -p "$d"
  cat >"$d/go.mod" <<EOM
module example.com/user

go $(sed -n 's/^go //p' "$repo/go.mod")

replace github.com/holdfast/holdfast => $repo
EOM
  {
    echo 'package main'
    echo 'import ('
    for p in "" /consul /etcd /semaphore /leader /metrics /fence/sqlfence "$@"; do
      echo "	_ \"github.com/holdfast/holdfast$p\""
    done
    echo ')'
    echo 'func main() {}'
  } >"$d/main.go"
  (cd "$d" && go mod tidy >/dev/null 2>"$d/tidy.log" && go build -o /dev/null . ) ||
    { echo "modgraph: the user module in $d does not build:" >&2; cat "$d/tidy.log" >&2; exit 1; }
}

usermod "$tmp/lib"
all=$(cd "$tmp/lib" && go list -m all)
n=$(printf '%s\n' "$all" | wc -l)
heavy=$(printf '%s\n' "$all" | grep -E "$HEAVY" | cut -d' ' -f1 || true)
pending=$(printf '%s\n' "$all" | grep -E "$PENDING" | cut -d' ' -f1 || true)
if [ -n "$heavy" ]; then
  echo "modgraph: FAIL: a module importing the library lists $n modules, among them:" >&2
  printf '  %s\n' $heavy >&2
  echo "  (go mod why -m in a module that imports the library says which package pulls each)" >&2
  fail=1
else
  echo "modgraph: the library alone: $n modules, none of gonum/plot, cobra, porcupine"
fi
[ -z "$pending" ] || echo "modgraph: PENDING (issue 19, through the library's tests): $(echo $pending)"

usermod "$tmp/tests" /embedtest
all=$(cd "$tmp/tests" && go list -m all)
n=$(printf '%s\n' "$all" | wc -l)
for want in go.etcd.io/etcd/server/v3 github.com/jackc/pgx/v5; do
  grep -q "^$want " <<<"$all" ||
    { echo "modgraph: FAIL: a module importing embedtest lacks $want" >&2; fail=1; }
done
echo "modgraph: the library and embedtest: $n modules, etcd/server and pgx among them"

mods=$(find . -name go.mod -not -path './.git/*' -printf '%h\n' | sed 's#^\./##' | sort)
work=$(GOFLAGS= GOWORK= go list -m -f '{{.Dir}}' | sed "s#^$repo/\?##; s#^\$#.#" | sort)
make=$(sed -n 's/^MODULES := //p' Makefile | tr ' ' '\n' | sort)
if [ "$mods" != "$work" ] || [ "$mods" != "$make" ]; then
  echo "modgraph: FAIL: go.mod files ($(echo $mods)), go.work ($(echo $work)) and the Makefile's MODULES ($(echo $make)) differ" >&2
  fail=1
fi
exit $fail
