//go:build holdfast_mutants

package mutant

import "os"

var removed = os.Getenv("HOLDFAST_MUTANT")

// On reports whether the guard called name is the one removed in this build
// (named by HOLDFAST_MUTANT).
func On(name string) bool { return name == removed }
