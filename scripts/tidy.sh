#!/usr/bin/env bash
# scripts/tidy.sh: `go mod tidy` for each module of go.work.
#
# The library's module (go.mod at the root) holds the library, its tests and
# embedtest. The command's module (cmd/holdfast: the CLI, the benchmark, the
# safety suite, the plot generator) requires the library at the version a
# release sets; while tidying, a temporary replace points it at this checkout,
# and it is dropped again: a go.mod with a replace directive breaks
# `go install github.com/holdfast/holdfast/cmd/holdfast@VERSION`.
#
# Usage: scripts/tidy.sh [-diff]   (-diff: change nothing, print what tidy
# would change and exit 1 if anything; make lint runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod
diff=()
[ "${1:-}" != -diff ] || diff=(-diff)

echo "tidy: . (the library)" >&2
go mod tidy "${diff[@]}"

m=cmd/holdfast
echo "tidy: $m" >&2
(cd "$m" &&
  go mod edit -replace github.com/holdfast/holdfast=../.. &&
  { rc=0; go mod tidy "${diff[@]}" || rc=$?; go mod edit -dropreplace github.com/holdfast/holdfast; exit $rc; })
