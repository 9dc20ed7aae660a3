package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
)

const fixture = "testdata/fixture" // its figures are stated in its comments

// TestFixture checks each figure on the fixture package, whose source says
// what each construct should count for.
func TestFixture(t *testing.T) {
	st, err := analyze(fixture)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(st.Files), "[{a.go 273} {tagged.go 6}]"; got != want {
		t.Errorf("files %s, want %s (a_test.go left out)", got, want)
	}
	if st.Lines != 279 || st.Tagged != 1 {
		t.Errorf("lines %d, tagged files %d, want 279 and 1", st.Lines, st.Tagged)
	}
	if len(st.Funcs) != 13 {
		t.Errorf("%d functions, want 13 (tagged.go's Tagged too)", len(st.Funcs))
	}
	f := map[string]funcStats{}
	for _, x := range st.Funcs {
		f[x.Name] = x
	}
	for name, want := range map[string][2]int{
		"long": {61, 1}, "mid": {42, 1}, "deep": {15, 5}, "flat": {1, 0}, "sleeper": {10, 2},
		"retries": {38, 3}, "Backoff.Retry": {9, 3}, "Thing.Get": {1, 1},
	} {
		if got := [2]int{f[name].Lines, f[name].Depth}; got != want {
			t.Errorf("%s: lines and depth %v, want %v", name, got, want)
		}
	}
	if f["deep"].At != "a.go:195" || f["long"].Pos != "a.go:68" {
		t.Errorf("deep's deepest statement at %s, long at %s; want a.go:195 (x++), a.go:68", f["deep"].At, f["long"].Pos)
	}

	var names []string
	for _, n := range st.Exported {
		names = append(names, n.Kind+" "+n.Name)
	}
	want := []string{"const C", "const D", "func New", "method Backoff.Retry", "method Doer.Do", "method Doer.Undo",
		"method Thing.Get", "method Thing.Put", "type Backoff", "type Doer", "type Store", "type Thing", "var A", "var B"}
	if !slices.Equal(names, want) {
		t.Errorf("exported names\n%q\nwant\n%q", names, want)
	}

	var long []string
	exp := 0
	for _, d := range st.Docs {
		if d.Exported {
			exp++
		}
		if d.Lines > longDoc {
			long = append(long, fmt.Sprintf("%s %s %d %v", d.Pos, d.Of, d.Lines, d.Exported))
		}
	}
	if got, want := strings.Join(long, "; "), "a.go:34 Thing 11 true; a.go:174 deep 12 false"; got != want {
		t.Errorf("doc comments over 10 lines: %s, want %s", got, want)
	}
	if exp != 13 || len(st.Docs) != 20 {
		t.Errorf("%d doc comments, %d of exported names; want 20 and 13 (Tagged's too)", len(st.Docs), exp)
	}

	var loops []string
	for _, r := range st.Retries {
		loops = append(loops, fmt.Sprintf("%s %s (%s)", r.Pos, r.Func, r.Why))
	}
	if got, want := strings.Join(loops, "; "), "a.go:223 retries (time.Sleep); a.go:230 retries (sleeper); a.go:239 retries (attempt bound)"; got != want {
		t.Errorf("retry loops: %s\nwant %s", got, want)
	}
}

// TestRun prints the summary table and the details.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out, []string{"-names", fixture}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| figure | testdata/fixture/ |",
		"| non-test lines (files) | 279 (2) |",
		"| functions over 40 / 60 lines | 2 / 1 |",
		"| deepest nesting (levels) | 5 (deep) |",
		"| exported names (type/func/method/var/const) | 14 (4/1/5/2/2) |",
		"| doc comments of exported names: median / over 10 lines / max | 1 / 1 / 11 |",
		"| doc comments over 10 lines, unexported names too | 2 |",
		"| hand-rolled retry loops | 3 |",
		"functions over 60 lines: a.go:68 long 61;",
		"exported method Doer.Undo\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if err := run(&out, nil); err == nil {
		t.Errorf("no directory: no error")
	}
}
