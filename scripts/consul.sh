#!/usr/bin/env bash
# scripts/consul.sh: build (once) and print the path of a real Consul server binary.
#
# No Consul package exists in Debian and no network but the Go module proxy is
# available, so the server is built from the Go module source
# github.com/hashicorp/consul@$CONSUL_VERSION. The result is cached in
# $HOLDFAST_CACHE (default: ~/.cache/holdfast) and reused on later runs, so the
# script is idempotent: the first run takes a few minutes, later ones are instant.
#
# Usage: scripts/consul.sh        # builds if needed, prints the binary path
# If CONSUL_BIN is set and executable, it is printed as is.
set -euo pipefail

if [ -n "${CONSUL_BIN:-}" ] && [ -x "${CONSUL_BIN}" ]; then
  echo "${CONSUL_BIN}"
  exit 0
fi

version="${CONSUL_VERSION:-v1.21.0}"
cache="${HOLDFAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/holdfast}"
bin="$cache/consul-$version/consul"

if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
mkdir -p "$cache"
lock="$cache/consul-$version.lock"
exec 9>"$lock"
flock 9   # two concurrent callers build once
if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi

echo "scripts/consul.sh: building consul $version from the Go module source (a few minutes, once)" >&2
work=$(mktemp -d "$cache/build-XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

dir=$(cd "$work" && go mod download -json "github.com/hashicorp/consul@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$dir" ] || [ ! -d "$dir" ]; then
  echo "scripts/consul.sh: go mod download of github.com/hashicorp/consul@$version failed" >&2
  exit 1
fi
cp -r "$dir" "$work/src"
chmod -R u+w "$work/src"
# The module's go.mod points at sibling directories (api, sdk, ...) through a
# replace block that only exists in the git checkout; drop it so the published
# module versions are used instead.
awk 'BEGIN{skip=0} /^replace \($/ {skip=1; next} skip && /^\)$/ {skip=0; next} !skip && !/^replace / {print}' \
  "$work/src/go.mod" > "$work/src/go.mod.new"
mv "$work/src/go.mod.new" "$work/src/go.mod"
mkdir -p "$(dirname "$bin")"
(cd "$work/src" && go build -mod=mod -trimpath -o "$bin.tmp" .)
mv "$bin.tmp" "$bin"
"$bin" version >&2
echo "$bin"
