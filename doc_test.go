package holdfast_test

import (
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDocsStartWithExample: the package docs of the root, etcd and consul
// show the code a user copies first (a code block in their first
// paragraph's wake), and that code is, as written, the body of an Example
// that go test runs against a real server; before, they started with
// prose ("backends live in sub-packages") and had no code.
func TestDocsStartWithExample(t *testing.T) {
	for _, tc := range []struct {
		doc, examples, example string
	}{
		{"doc.go", "etcd/example_test.go", "ExampleMutex_Lock"},
		{"etcd/doc.go", "etcd/example_test.go", "ExampleMutex_Lock"},
		{"consul/doc.go", "consul/example_test.go", "ExampleDial"},
	} {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, tc.doc, nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil || f.Doc == nil {
			t.Fatalf("%s: no package doc (%v)", tc.doc, err)
		}
		lines := strings.Split(f.Doc.Text(), "\n")
		first := -1
		var code []string
		for i, l := range lines {
			if strings.HasPrefix(l, "\t") {
				if first < 0 {
					first = i
				}
				code = append(code, l[1:])
			} else if first >= 0 && l != "" {
				break
			}
		}
		if first < 0 || first > 6 {
			t.Errorf("%s: the first code block is at line %d of the package doc, want within its first paragraph (6 lines)", tc.doc, first)
			continue
		}
		snippet := strings.TrimSpace(strings.Join(code, "\n"))
		src, err := os.ReadFile(tc.examples)
		if err != nil {
			t.Fatal(err)
		}
		body := regexp.MustCompile(`(?s)\nfunc ` + tc.example + `\(\) \{\n(.*?)\n\}\n`).FindSubmatch(src)
		if body == nil {
			t.Fatalf("%s has no %s", tc.examples, tc.example)
		}
		if !strings.Contains(dedent(string(body[1]), code[0]), snippet) {
			t.Errorf("%s's code is not, as written, in the body of %s (%s):\n%s", tc.doc, tc.example, tc.examples, snippet)
		}
	}
}

// dedent removes from every line of s as many tabs as the line holding
// first (trimmed) starts with.
func dedent(s, first string) string {
	lines := strings.Split(s, "\n")
	n := 0
	for _, l := range lines {
		if strings.TrimSpace(l) == first {
			n = len(l) - len(strings.TrimLeft(l, "\t"))
			break
		}
	}
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, strings.Repeat("\t", n))
	}
	return strings.Join(lines, "\n")
}
