package benchdocs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func loadFixture(t *testing.T) Data {
	t.Helper()
	d, err := LoadFiles([]string{"testdata/fixture.jsonl"})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestGenerateFixture: the fixture's rows give non-empty PNGs for every
// kind of plot the rows allow, tables with every row, and notes for what
// they do not allow.
func TestGenerateFixture(t *testing.T) {
	d := loadFixture(t)
	if len(d.Rows) != 12 || len(d.Ratios) != 1 {
		t.Fatalf("%d rows and %d ratios, want 12 and 1", len(d.Rows), len(d.Ratios))
	}
	dir := t.TempDir()
	out, err := Generate(d, Options{Dir: dir, Label: "fixture run", Sources: []string{"testdata/fixture.jsonl"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"etcd-lock-throughput.png", "etcd-lock-handoff-p99.png",
		"consul-handoff-throughput.png", "consul-handoff-handoff-p99.png",
		"consul-waiters-rpcs.png", "many-locks-memory.png", "many-locks-renewals.png", "many-locks-requests.png",
	}
	for _, f := range want {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Errorf("%s: %v (plots: %v)", f, err, out.Plots)
			continue
		}
		if st.Size() < 1000 {
			t.Errorf("%s: %d bytes", f, st.Size())
		}
		b, _ := os.ReadFile(filepath.Join(dir, f))
		if !strings.HasPrefix(string(b), "\x89PNG") {
			t.Errorf("%s is not a PNG", f)
		}
		if !strings.Contains(out.Markdown, "](bench/"+f+")") {
			t.Errorf("markdown does not link %s", f)
		}
	}
	if len(out.Plots) != len(want) {
		t.Errorf("plots %v, want %v", out.Plots, want)
	}
	md := out.Markdown
	for _, s := range []string{
		"**fixture run**",
		"#### etcd, lock", "#### consul, handoff", "#### consul, waiters", "#### etcd, many-locks", "#### etcd, ratios",
		"| holdfast | 8 | 0 | 716 | 716 | 0.398 |", // of_floor next to the throughput
		"| floor | 8 | 0 | 1800 | 1800 | - |",
		"| holdfast | 129 | 128 | 6.2 | 3100 |", // waiters column from the rows that have it
		"| holdfast | 10000 | 4.4 |",
		"| lock | 8 | 0 | holdfast/native | 9.06 |",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	// The fixture has no lock rows on Consul, no handoff rows on etcd and
	// no floor on Consul: the notes say so.
	for _, s := range []string{"consul handoff: no floor rows"} {
		if !strings.Contains(strings.Join(out.Notes, "\n"), s) {
			t.Errorf("notes lack %q: %v", s, out.Notes)
		}
	}
	// A column no row of a table has is left out.
	if strings.Contains(md, "takeover_ms") {
		t.Errorf("markdown has a takeover_ms column, which no row has")
	}
}

// TestGenerateMissingFields: rows without the plotted fields give no plot
// and a note, not an error.
func TestGenerateMissingFields(t *testing.T) {
	d, err := Load(strings.NewReader(`{"scenario":"waiters","backend":"etcd","impl":"holdfast","contenders":2}
{"scenario":"many-locks","backend":"etcd","impl":"holdfast","locks":10}
`), "x")
	if err != nil {
		t.Fatal(err)
	}
	out, err := Generate(d, Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Plots) != 0 {
		t.Errorf("plots %v from rows without the plotted fields", out.Plots)
	}
	notes := strings.Join(out.Notes, "\n")
	for _, s := range []string{`no "lock" rows`, "etcd waiters: no row has both", "many-locks: no row has heap_bytes_per_grant"} {
		if !strings.Contains(notes, s) {
			t.Errorf("notes lack %q:\n%s", s, notes)
		}
	}
	if !strings.Contains(out.Markdown, "Notes:") {
		t.Errorf("markdown has no notes:\n%s", out.Markdown)
	}
}

func TestLoadBadInput(t *testing.T) {
	for _, in := range []string{"{not json", `{"scenario":"lock"}`, `[1,2]`} {
		if _, err := Load(strings.NewReader(in), "bad"); !errors.Is(err, ErrBadInput) {
			t.Errorf("%q: %v, want ErrBadInput", in, err)
		}
	}
}

func TestSplice(t *testing.T) {
	doc := "# B\n\nprose before\n\n" + BeginMarker + "\nold tables\n" + EndMarker + "\n\nprose after\n"
	got, err := Splice(doc, "new tables\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "# B\n\nprose before\n\n" + BeginMarker + "\nnew tables\n" + EndMarker + "\n\nprose after\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// Splicing again gives the same document.
	if again, _ := Splice(got, "new tables\n"); again != got {
		t.Errorf("second splice changed the document: %q", again)
	}
	for _, bad := range []string{"no markers", EndMarker + BeginMarker, BeginMarker} {
		if _, err := Splice(bad, "x"); !errors.Is(err, ErrNoMarkers) {
			t.Errorf("%q: %v, want ErrNoMarkers", bad, err)
		}
	}
}

// TestLoadMembers: rows of a cluster of several members (--nodes 3) are
// kept apart from those of a one-member server, in their own backend.
func TestLoadMembers(t *testing.T) {
	in := `{"scenario":"lock","backend":"etcd","impl":"holdfast","contenders":8,"nodes":3}
{"scenario":"lock","backend":"etcd","impl":"holdfast","contenders":8,"nodes":1}
{"ratio":{"scenario":"lock","backend":"etcd","contenders":8,"nodes":3}}
`
	d, err := Load(strings.NewReader(in), "in")
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{d.Rows[0].Str("backend"), d.Rows[1].Str("backend"), d.Ratios[0].Str("backend")}; got[0] != "etcd-3-members" || got[1] != "etcd" || got[2] != "etcd-3-members" {
		t.Errorf("backends %v, want [etcd-3-members etcd etcd-3-members]", got)
	}
}
