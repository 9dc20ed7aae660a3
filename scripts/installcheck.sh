#!/usr/bin/env bash
# scripts/installcheck.sh: `go install github.com/holdfast/holdfast/cmd/holdfast@VERSION`
# works once a release is tagged (README, "Getting started").
#
# It does what a release does, into a module proxy on disk instead of a
# repository: every module of the repository that the command needs (the
# library, embedtest/etcdtest for `holdfast dev` and the demo, the command)
# at v0.0.1-installcheck, each go.mod's requires of the repository's modules
# set to that version (their only edit; no replace directive), zipped as the
# proxy serves them. Then, from outside any module, go install ...@that
# version must build a binary that runs. Every other module comes from the
# usual proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=
ver=v0.0.1-installcheck
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The committed tree, as a tag would publish it.
mkdir -p "$tmp/src"
git archive HEAD | tar x -C "$tmp/src"
# The published modules (directories): the command and every repository
# module it requires.
pub=". embedtest/etcdtest cmd/holdfast"
for d in $pub; do
  (cd "$tmp/src/$d" &&
    { ! grep -q '^replace' go.mod || { echo "installcheck: $d/go.mod has a replace directive: go install @version refuses it" >&2; exit 1; }; } &&
    for r in $(grep -o '^\s*github\.com/holdfast/holdfast[^ ]* v0\.0\.0-00010101000000-000000000000' go.mod | awk '{print $1}'); do
      rd=${r#github.com/holdfast/holdfast}; rd=${rd#/}; rd=${rd:-.}
      case " $pub " in *" $rd "*) ;; *) echo "installcheck: $d requires $r, which this script does not publish: add $rd to pub" >&2; exit 1 ;; esac
      go mod edit -require "$r@$ver"
    done)
done

mkdir -p "$tmp/tool"
cat >"$tmp/tool/go.mod" <<'EOM'
module mkproxy

go 1.26.7

require golang.org/x/mod v0.42.0
EOM
cat >"$tmp/tool/main.go" <<'EOM'
// mkproxy PROXYDIR MODPATH VERSION DIR: one module version in a GOPROXY directory.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	root, path, ver, dir := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	esc, err := module.EscapePath(path)
	check(err)
	d := filepath.Join(root, esc, "@v")
	check(os.MkdirAll(d, 0o755))
	f, err := os.Create(filepath.Join(d, ver+".zip"))
	check(err)
	check(zip.CreateFromDir(f, module.Version{Path: path, Version: ver}, dir))
	check(f.Close())
	gm, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	check(err)
	check(os.WriteFile(filepath.Join(d, ver+".mod"), gm, 0o644))
	check(os.WriteFile(filepath.Join(d, ver+".info"), []byte(fmt.Sprintf(`{"Version":%q,"Time":"2026-01-01T00:00:00Z"}`, ver)), 0o644))
	check(os.WriteFile(filepath.Join(d, "list"), []byte(ver+"\n"), 0o644))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkproxy:", err)
		os.Exit(1)
	}
}
EOM
(cd "$tmp/tool" && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 && go build -o mkproxy .)
for d in $pub; do
  path=github.com/holdfast/holdfast; [ "$d" = . ] || path=$path/$d
  "$tmp/tool/mkproxy" "$tmp/proxy" "$path" "$ver" "$tmp/src/$d"
done

start=$(date +%s)
(cd "$tmp" && GOPROXY="file://$tmp/proxy,$(go env GOPROXY)" GONOSUMDB=github.com/holdfast GOBIN="$tmp/bin" \
  go install "github.com/holdfast/holdfast/cmd/holdfast@$ver")
out=$("$tmp/bin/holdfast" version)
case $out in
  "holdfast $ver "*) echo "installcheck: go install github.com/holdfast/holdfast/cmd/holdfast@$ver: $out ($(( $(date +%s) - start ))s)" ;;
  *) echo "installcheck: the installed binary says: $out" >&2; exit 1 ;;
esac
