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
#    Nor etcd's server or pgx: go mod tidy in the user's module also loads
#    the tests of every package it imports (one level deep), so no package
#    or test of the library's module imports them; the tests that need a
#    real etcd or PostgreSQL live in the tests module (tests/, etcd's own
#    layout), the servers in embedtest/etcdtest and embedtest/pgtest.
# 2. The same module importing embedtest/etcdtest and embedtest/pgtest too
#    (a user's own tests) gets the servers: etcd/server and pgx appear then.
# 3. Every go.mod of the repository is a module of go.work and of the
#    Makefile's MODULES, so lint and tests cover it.
# It prints the module counts. Exits 1, naming the culprits, otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod
HEAVY='^(gonum\.org/v1/plot|github\.com/spf13/cobra|github\.com/anishathalye/porcupine|codeberg\.org/go-latex/latex|go\.etcd\.io/etcd/server/v3|github\.com/jackc/pgx/v5) '

fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

usermod() { # dir, extra import lines...
  local d=$1; shift
  mkdir -p "$d"
  cat >"$d/go.mod" <<EOM
module example.com/user

go $(sed -n 's/^go //p' "$repo/go.mod")

replace (
	github.com/holdfast/holdfast => $repo
	github.com/holdfast/holdfast/embedtest/etcdtest => $repo/embedtest/etcdtest
	github.com/holdfast/holdfast/embedtest/pgtest => $repo/embedtest/pgtest
)
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
if [ -n "$heavy" ]; then
  echo "modgraph: FAIL: a module importing the library lists $n modules, among them:" >&2
  printf '  %s\n' $heavy >&2
  echo "  (go mod why -m in a module that imports the library says which package pulls each)" >&2
  fail=1
else
  echo "modgraph: the library alone: $n modules, none of gonum/plot, cobra, porcupine, etcd/server, pgx"
fi

usermod "$tmp/tests" /embedtest /embedtest/etcdtest /embedtest/pgtest
all=$(cd "$tmp/tests" && go list -m all)
n=$(printf '%s\n' "$all" | wc -l)
for want in go.etcd.io/etcd/server/v3 github.com/jackc/pgx/v5; do
  grep -q "^$want " <<<"$all" ||
    { echo "modgraph: FAIL: a module importing etcdtest and pgtest lacks $want" >&2; fail=1; }
done
echo "modgraph: the library, etcdtest and pgtest: $n modules, etcd/server and pgx among them"

mods=$(find . -name go.mod -not -path './.git/*' -printf '%h\n' | sed 's#^\./##' | sort)
work=$(GOFLAGS= GOWORK= go list -m -f '{{.Dir}}' | sed "s#^$repo/\?##; s#^\$#.#" | sort)
make=$(sed -n 's/^MODULES := //p' Makefile | tr ' ' '\n' | sort)
if [ "$mods" != "$work" ] || [ "$mods" != "$make" ]; then
  echo "modgraph: FAIL: go.mod files ($(echo $mods)), go.work ($(echo $work)) and the Makefile's MODULES ($(echo $make)) differ" >&2
  fail=1
fi
exit $fail
