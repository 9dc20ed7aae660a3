package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocsListCommands: the command list of the package doc (with each
// command's summary) and the README's row for cmd/holdfast name exactly the
// commands the binary has, cobra's completion and help included.
func TestDocsListCommands(t *testing.T) {
	var names []string
	summaries := map[string]string{}
	for _, c := range commands {
		names = append(names, c.name)
		summaries[c.name] = c.summary
	}
	names = append(names, "completion", "help")
	slices.Sort(names)

	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(src), "// Commands:\n//\n")
	block, _, _ = strings.Cut(block, "//\n")
	var doc []string
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		name, summary, _ := strings.Cut(strings.TrimPrefix(line, "//\t"), " ")
		doc = append(doc, name)
		if want, ok := summaries[name]; ok && strings.TrimSpace(summary) != want {
			t.Errorf("main.go's package doc says %s: %q; its summary is %q", name, strings.TrimSpace(summary), want)
		}
	}
	slices.Sort(doc)
	if !slices.Equal(doc, names) {
		t.Errorf("main.go's package doc lists the commands %q; the binary has %q", doc, names)
	}

	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `cmd/holdfast` \\| CLI: (.*) \\|$").FindSubmatch(readme)
	if row == nil {
		t.Fatal("README.md has no row for cmd/holdfast in its layout table")
	}
	var listed []string
	for _, m := range regexp.MustCompile("`([a-z]+)`").FindAllSubmatch(row[1], -1) {
		listed = append(listed, string(m[1]))
	}
	slices.Sort(listed)
	if !slices.Equal(listed, names) {
		t.Errorf("README.md's row for cmd/holdfast lists %q; the binary has %q", listed, names)
	}
}

// TestDocsGoWorkSection: the README section that go.work's comment refers
// to exists (it referred to a missing "Installing the command").
func TestDocsGoWorkSection(t *testing.T) {
	work, err := os.ReadFile("../../go.work")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	refs := regexp.MustCompile(`README, "([^"]+)"`).FindAllSubmatch(work, -1)
	if len(refs) == 0 {
		t.Fatal("go.work's comment names no README section")
	}
	for _, ref := range refs {
		if !regexp.MustCompile(`(?m)^#+ ` + regexp.QuoteMeta(string(ref[1])) + `$`).Match(readme) {
			t.Errorf("go.work refers to the README section %q, which README.md does not have", ref[1])
		}
	}
}
