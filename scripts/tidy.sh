#!/usr/bin/env bash
# scripts/tidy.sh: `go mod tidy` for each module of go.work.
#
# The library's module (go.mod at the root) holds the library and the light
# embedtest (Consul agent, fault proxy, PKI). The other modules (the command
# with its harness, embedtest's etcd and PostgreSQL servers, the examples,
# the tests against real servers) require the repository's modules at the
# version a release sets; while tidying one, temporary replace directives
# point every repository module at this checkout, and they are dropped again:
# a go.mod with a replace directive breaks
# `go install github.com/holdfast/holdfast/cmd/holdfast@VERSION`.
#
# Usage: scripts/tidy.sh [-diff]   (-diff: change nothing, print what tidy
# would change and exit 1 if anything; make lint runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
mods=$(GOWORK= GOFLAGS= go list -m -f '{{.Path}}|{{.Dir}}')
export GOWORK=off
diff=()
[ "${1:-}" != -diff ] || diff=(-diff)

echo "tidy: . (the library)" >&2
go mod tidy "${diff[@]}"

for m in $mods; do
  dir=${m#*|}
  [ "$dir" != "$repo" ] || continue
  echo "tidy: ${dir#$repo/}" >&2
  (cd "$dir" &&
    reps=() && drops=() &&
    for o in $mods; do
      [ "${o#*|}" != "$dir" ] || continue
      reps+=(-replace "${o%|*}=$(realpath --relative-to=. "${o#*|}")")
      drops+=(-dropreplace "${o%|*}")
    done &&
    go mod edit "${reps[@]}" &&
    { rc=0; go mod tidy "${diff[@]}" || rc=$?; go mod edit "${drops[@]}"; exit $rc; })
done
