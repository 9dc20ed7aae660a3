package holdfast_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// designNotGo are the names in backticks in docs/DESIGN.md that look like
// Go identifiers but are not this module's: other packages' qualifiers
// (their names after the dot are not checked), and words of the stores or
// of the repository.
var designNotGo = []string{
	"api", "concurrency", "recipe", // other packages' qualifiers
	"If", "LeaseValue", // etcd's compare functions
	"cas",   // a Consul transaction verb
	"tests", // the tests module
}

// TestDesignNamesExist: every Go identifier that docs/DESIGN.md names in
// backticks (`Session.Close`, `acquire(...)`, `core.Grant`) is declared
// somewhere in the module's Go files (a package, type, function, method,
// field, variable or constant; for a conformance property X, its testX),
// or is listed in designNotGo; so the design
// notes cannot name a function that was renamed or removed (before, they
// named campaignHold, which no longer existed).
func TestDesignNamesExist(t *testing.T) {
	doc, err := os.ReadFile("docs/DESIGN.md")
	if err != nil {
		t.Fatal(err)
	}
	declared := declaredNames(t, ".")
	for _, n := range designNotGo {
		declared[n] = true
	}
	var missing []string
	for _, span := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(string(doc), -1) {
		for _, name := range goNames(span[1]) {
			known := declared[name] || declared["test"+name] // a conformance property runs testName
			if !known && !slices.Contains(missing, name) {
				missing = append(missing, name)
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("docs/DESIGN.md names Go identifiers that the module does not declare (rename them, or add non-Go names to designNotGo): %s", strings.Join(missing, ", "))
	}
}

var (
	goName  = regexp.MustCompile(`^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$`)
	envName = regexp.MustCompile(`^[A-Z0-9]+(_[A-Z0-9]+)+$`)
)

// goNames returns the names to check in a backticked span that reads as a
// Go identifier, a qualified one (a.b.c) or a call of one (f(x, y), T[G]);
// nothing for anything else (file names, keys, commands, env variables).
// After a qualifier listed in designNotGo, nothing more is checked.
func goNames(span string) []string {
	if i := strings.IndexAny(span, "(["); i > 0 {
		span = span[:i]
	}
	if !goName.MatchString(span) {
		return nil
	}
	parts := strings.Split(span, ".")
	switch last := parts[len(parts)-1]; {
	case len(parts) > 1 && slices.Contains([]string{"go", "md", "sh", "mod", "json", "jsonl", "txt", "yml"}, last):
		return nil // a file
	case envName.MatchString(span):
		return nil // an environment variable
	}
	if slices.Contains(designNotGo, parts[0]) {
		return parts[:1]
	}
	return parts
}

// declaredNames returns the names declared in the Go files under root:
// package names, and the names of top-level declarations, methods, struct
// fields and interface methods.
func declaredNames(t *testing.T, root string) map[string]bool {
	names := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go"):
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		names[f.Name.Name] = true
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok {
				names[fn.Name.Name] = true
				continue
			}
			for _, spec := range d.(*ast.GenDecl).Specs {
				switch spec := spec.(type) {
				case *ast.ValueSpec:
					for _, id := range spec.Names {
						names[id.Name] = true
					}
				case *ast.TypeSpec:
					names[spec.Name.Name] = true
					ast.Inspect(spec.Type, func(n ast.Node) bool {
						if fields, ok := n.(*ast.FieldList); ok {
							for _, f := range fields.List {
								for _, id := range f.Names {
									names[id.Name] = true
								}
							}
						}
						return true
					})
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}
