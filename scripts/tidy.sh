#!/usr/bin/env bash
# scripts/tidy.sh: `go mod tidy` for each module of go.work.
#
# The library's module (go.mod at the root) holds the library, its tests and
# embedtest. The command's module (cmd/holdfast: the CLI, the benchmark, the
# safety suite, the plot generator) requires the library at the version a
# release sets; while tidying, a temporary replace points it at this checkout,
# and it is dropped again: a go.mod with a replace directive breaks
# `go install github.com/holdfast/holdfast/cmd/holdfast@VERSION`.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod

echo "tidy: . (the library)" >&2
go mod tidy

m=cmd/holdfast
echo "tidy: $m" >&2
(cd "$m" &&
  go mod edit -replace github.com/holdfast/holdfast=../.. &&
  { rc=0; go mod tidy || rc=$?; go mod edit -dropreplace github.com/holdfast/holdfast; exit $rc; })
