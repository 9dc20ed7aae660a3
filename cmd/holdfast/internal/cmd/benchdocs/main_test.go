package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/cmd/holdfast/internal/benchdocs"
)

const fixture = "../../benchdocs/testdata/fixture.jsonl"

// TestRun splices the tables into a document between its markers, keeps
// the prose around them, and writes the plots.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	doc := filepath.Join(dir, "B.md")
	prose := "# B\n\nprose\n\n" + benchdocs.BeginMarker + "\nold\n" + benchdocs.EndMarker + "\n\nafter\n"
	if err := os.WriteFile(doc, []byte(prose), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "bench")
	if err := run([]string{"-out", out, "-doc", doc, "-label", "test run", fixture}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(doc)
	s := string(b)
	for _, want := range []string{"# B\n\nprose\n\n" + benchdocs.BeginMarker + "\n**test run**", "#### etcd, many-locks", benchdocs.EndMarker + "\n\nafter\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("document lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "\nold\n") {
		t.Errorf("the old section is still there")
	}
	if st, err := os.Stat(filepath.Join(out, "many-locks-memory.png")); err != nil || st.Size() == 0 {
		t.Errorf("no memory plot: %v", err)
	}
}

func TestRunBadInput(t *testing.T) {
	dir := t.TempDir()
	noMarkers := filepath.Join(dir, "B.md")
	os.WriteFile(noMarkers, []byte("# B\n"), 0o644)
	if err := run([]string{"-out", dir}); !errors.Is(err, benchdocs.ErrBadInput) {
		t.Errorf("no input files: %v, want ErrBadInput", err)
	}
	if err := run([]string{"-out", dir, "-doc", noMarkers, fixture}); !errors.Is(err, benchdocs.ErrNoMarkers) {
		t.Errorf("document without markers: %v, want ErrNoMarkers", err)
	}
	if b, _ := os.ReadFile(noMarkers); string(b) != "# B\n" {
		t.Errorf("document without markers was changed: %q", b)
	}
	if err := run([]string{"-out", dir, "-doc", "", filepath.Join(dir, "missing.jsonl")}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing input: %v, want ErrNotExist", err)
	}
}
