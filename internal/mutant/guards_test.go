package mutant

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestGuardsListed: the guards the code can remove (every mutant.On name)
// are exactly the rows of docs/GUARDS.md's table, which scripts/mutants.sh
// runs: a guard missing from the table would never be checked.
func TestGuardsListed(t *testing.T) {
	root := filepath.Join("..", "..")
	on := regexp.MustCompile(`mutant\.On\("([^"]+)"\)`)
	var code []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range on.FindAllSubmatch(b, -1) {
			code = append(code, string(m[1]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	guards, err := os.ReadFile(filepath.Join(root, "docs", "GUARDS.md"))
	if err != nil {
		t.Fatal(err)
	}
	var doc []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z]+/[a-z0-9-]+)` \\|").FindAllSubmatch(guards, -1) {
		doc = append(doc, string(m[1]))
	}
	slices.Sort(code)
	code = slices.Compact(code)
	slices.Sort(doc)
	if !slices.Equal(code, doc) || len(doc) == 0 {
		t.Errorf("guards in the code: %q\nrows of docs/GUARDS.md: %q", code, doc)
	}
}
