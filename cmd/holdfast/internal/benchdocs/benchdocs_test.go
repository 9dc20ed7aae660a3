package benchdocs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"
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

// TestOneStylePerImplementation: an implementation has one colour and
// marker in every plot, whichever others the plot shows (the index-based
// palette drew native as green squares, and floor too where native was
// missing), and no two implementations share one.
func TestOneStylePerImplementation(t *testing.T) {
	pts := func(y float64) series { return series{pts: plotter.XYs{{X: 1, Y: y}, {X: 8, Y: y}}} }
	named := func(n string, y float64) series { s := pts(y); s.name = n; return s }
	g := &gen{opts: Options{Dir: t.TempDir()}}
	for _, c := range []chart{
		{file: "all.png", series: []series{named("holdfast", 1), named("native", 2), named("floor", 3)}},
		{file: "no-native.png", series: []series{named("holdfast", 1), named("floor", 3)}},
		{file: "no-holdfast.png", series: []series{named("native (0 handoffs: its releaser takes the lock again)", 2), named("floor", 3)}},
		{file: "backends.png", series: []series{named("consul holdfast", 1), named("etcd holdfast", 2), named("etcd native", 3)}},
	} {
		if _, err := g.build(c); err != nil {
			t.Fatal(err)
		}
	}
	type look struct{ color, shape string }
	seen := map[string]look{}
	owner := map[look]string{}
	for _, d := range g.drawn {
		impl, _, _ := strings.Cut(d.name, " (")
		if _, i, ok := strings.Cut(impl, " "); ok {
			impl = i
		}
		l := look{fmt.Sprint(d.color), fmt.Sprintf("%T", d.shape)}
		if prev, ok := seen[impl]; ok && prev != l {
			t.Errorf("%s: %q drawn as %v, elsewhere as %v", d.file, d.name, l, prev)
		}
		seen[impl] = l
		if o, ok := owner[l]; ok && o != impl {
			t.Errorf("%s: %q drawn like %q (%v)", d.file, d.name, o, l)
		}
		owner[l] = impl
	}
	if len(seen) != 3 {
		t.Errorf("styles of %d implementations, want 3: %v", len(seen), seen)
	}
}

// TestArtefactAndHandoffsSaid: a negative heap per grant (an artefact of
// the sampling) is not drawn but noted, and a throughput series with no
// handoff in any contended run says so in its legend.
func TestArtefactAndHandoffsSaid(t *testing.T) {
	rows := `{"scenario":"many-locks","backend":"etcd","impl":"holdfast","locks":1000,"heap_bytes_per_grant":-140.9}
{"scenario":"many-locks","backend":"etcd","impl":"holdfast","locks":10000,"heap_bytes_per_grant":1410}
{"scenario":"lock","backend":"consul","impl":"native","contenders":1,"hold_ms":0,"acq_per_s":876,"handoffs":0}
{"scenario":"lock","backend":"consul","impl":"native","contenders":8,"hold_ms":0,"acq_per_s":880,"handoffs":0}
{"scenario":"lock","backend":"consul","impl":"holdfast","contenders":8,"hold_ms":0,"acq_per_s":400,"handoffs":1233}
`
	d, err := Load(strings.NewReader(rows), "inline")
	if err != nil {
		t.Fatal(err)
	}
	g := &gen{d: d, opts: Options{Dir: t.TempDir()}, md: &strings.Builder{}}
	if err := g.plots(); err != nil {
		t.Fatal(err)
	}
	var legends []string
	for _, s := range g.drawn {
		for _, p := range s.pts {
			if s.file == "many-locks-memory.png" && p.Y < 0 {
				t.Errorf("%s: %q draws %v B per grant at %v locks", s.file, s.name, p.Y, p.X)
			}
		}
		if s.file == "consul-lock-throughput.png" {
			legends = append(legends, s.name)
		}
	}
	if !slices.Contains(legends, "native (0 handoffs: its releaser takes the lock again)") || !slices.Contains(legends, "holdfast") {
		t.Errorf("consul lock throughput legends %q: want native's 0 handoffs said, holdfast plain", legends)
	}
	if !slices.ContainsFunc(g.notes, func(n string) bool { return strings.Contains(n, "-140.9 B per grant") }) {
		t.Errorf("notes %q: want the artefact named", g.notes)
	}
}
