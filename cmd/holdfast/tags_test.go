//go:build !holdfast_mutants

package main

// buildTags are the build tags of the binary the tests build: those of the
// test binary, so that scripts/mutants.sh removes a guard in both.
const buildTags = ""
