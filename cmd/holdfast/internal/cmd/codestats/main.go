// Command codestats measures the readability figures of issue 27's table
// for each package directory given, over its non-test .go files:
//
//	go run ./cmd/holdfast/internal/cmd/codestats [-names] [-top N] DIR...
//
// It prints one summary table (a column per directory), then each
// directory's details. What it counts:
//
//   - lines: newlines per file, as `wc -l`, of every non-test .go file
//     whatever its build tags (the tagged ones are counted apart);
//   - functions: declarations with a body (functions and methods; function
//     literals belong to the function that holds them); a function's length
//     runs from its func keyword to its closing brace; those over 40 lines
//     are counted, those over 60 listed with file:line;
//   - nesting: the indentation level of a function's deepest statement as
//     gofmt lays it out (the body's statements are at 1; if, for, else,
//     a case clause and a function literal's body add one; see nesting);
//   - exported names of a default build (no tags): types, functions,
//     methods of exported types and of exported interfaces, vars and
//     consts; not struct fields;
//   - doc comments of declarations (of a func, a type, var or const
//     declaration and of each spec in a group; not the package comment nor
//     fields): of the exported names, the median (the lower one of an even
//     count), those over 10 lines and the longest; over 10 lines of all
//     names too;
//   - hand-rolled retry loops, by the heuristic of retries (stats.go), all
//     but core.Backoff's own.
//
// `make codestats` runs it on the root package, etcd, consul and
// internal/core.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

func main() {
	if err := run(os.Stdout, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "codestats:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, args []string) error {
	fs := flag.NewFlagSet("codestats", flag.ContinueOnError)
	names := fs.Bool("names", false, "list every exported name")
	top := fs.Int("top", 5, "how many of the most nested functions to list per directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("no directories given")
	}
	var all []*pkgStats
	for _, d := range fs.Args() {
		st, err := analyze(d)
		if err != nil {
			return err
		}
		all = append(all, st)
	}
	summary(w, all)
	for _, st := range all {
		details(w, st, *top, *names)
	}
	return nil
}

func label(st *pkgStats) string {
	d := filepath.ToSlash(filepath.Clean(st.Dir))
	if d == "." {
		return "root"
	}
	return d + "/"
}

// summary prints the table: one row per figure, one column per directory.
func summary(w io.Writer, all []*pkgStats) {
	head := []string{"figure"}
	sep := []string{"---"}
	for _, st := range all {
		head = append(head, label(st))
		sep = append(sep, "---")
	}
	row := func(name string, f func(*pkgStats) string) {
		cells := []string{name}
		for _, st := range all {
			cells = append(cells, f(st))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	fmt.Fprintf(w, "| %s |\n| %s |\n", strings.Join(head, " | "), strings.Join(sep, " | "))
	row("non-test lines (files)", func(st *pkgStats) string {
		return fmt.Sprintf("%d (%d)", st.Lines, len(st.Files))
	})
	row("build-tagged files", func(st *pkgStats) string { return fmt.Sprint(st.Tagged) })
	row("functions", func(st *pkgStats) string { return fmt.Sprint(len(st.Funcs)) })
	row(fmt.Sprintf("functions over %d / %d lines", longFunc, tooLongFunc), func(st *pkgStats) string {
		return fmt.Sprintf("%d / %d", count(st.Funcs, func(f funcStats) bool { return f.Lines > longFunc }),
			count(st.Funcs, func(f funcStats) bool { return f.Lines > tooLongFunc }))
	})
	row("longest function", func(st *pkgStats) string {
		f := slices.MaxFunc(st.Funcs, func(a, b funcStats) int { return a.Lines - b.Lines })
		return fmt.Sprintf("%d (%s)", f.Lines, f.Name)
	})
	row("deepest nesting (levels)", func(st *pkgStats) string {
		f := slices.MaxFunc(st.Funcs, func(a, b funcStats) int { return a.Depth - b.Depth })
		return fmt.Sprintf("%d (%s)", f.Depth, f.Name)
	})
	row(fmt.Sprintf("functions nested over %d levels", deepNesting), func(st *pkgStats) string {
		return fmt.Sprint(count(st.Funcs, func(f funcStats) bool { return f.Depth > deepNesting }))
	})
	row("exported names (type/func/method/var/const)", func(st *pkgStats) string {
		k := kinds(st)
		return fmt.Sprintf("%d (%d/%d/%d/%d/%d)", len(st.Exported), k["type"], k["func"], k["method"], k["var"], k["const"])
	})
	row(fmt.Sprintf("doc comments of exported names: median / over %d lines / max", longDoc), func(st *pkgStats) string {
		var ls []int
		for _, d := range st.Docs {
			if d.Exported {
				ls = append(ls, d.Lines)
			}
		}
		if len(ls) == 0 {
			return "-"
		}
		slices.Sort(ls)
		return fmt.Sprintf("%d / %d / %d", ls[(len(ls)-1)/2], count(ls, func(n int) bool { return n > longDoc }), ls[len(ls)-1])
	})
	row(fmt.Sprintf("doc comments over %d lines, unexported names too", longDoc), func(st *pkgStats) string {
		return fmt.Sprint(count(st.Docs, func(d docComment) bool { return d.Lines > longDoc }))
	})
	row("hand-rolled retry loops", func(st *pkgStats) string { return fmt.Sprint(len(st.Retries)) })
}

func count[T any](s []T, f func(T) bool) int {
	n := 0
	for _, x := range s {
		if f(x) {
			n++
		}
	}
	return n
}

func kinds(st *pkgStats) map[string]int {
	k := map[string]int{}
	for _, n := range st.Exported {
		k[n.Kind]++
	}
	return k
}

// details prints one directory's lists: lines per file, the long and the
// deeply nested functions, the long doc comments, the retry loops and, with
// -names, the exported names.
func details(w io.Writer, st *pkgStats, top int, names bool) {
	fmt.Fprintf(w, "\n## %s\n", label(st))
	var fl []string
	for _, f := range st.Files {
		fl = append(fl, fmt.Sprintf("%s %d", f.Name, f.Lines))
	}
	fmt.Fprintf(w, "lines per file: %s\n", strings.Join(fl, ", "))

	long := slices.Clone(st.Funcs)
	sort.SliceStable(long, func(i, j int) bool { return long[i].Lines > long[j].Lines })
	fmt.Fprintf(w, "functions over %d lines:", tooLongFunc)
	for _, f := range long {
		if f.Lines <= tooLongFunc {
			break
		}
		fmt.Fprintf(w, " %s %s %d;", f.Pos, f.Name, f.Lines)
	}
	fmt.Fprintf(w, "\nfunctions of %d-%d lines:", longFunc+1, tooLongFunc)
	for _, f := range long {
		if f.Lines > longFunc && f.Lines <= tooLongFunc {
			fmt.Fprintf(w, " %s %d;", f.Name, f.Lines)
		}
	}

	deep := slices.Clone(st.Funcs)
	sort.SliceStable(deep, func(i, j int) bool { return deep[i].Depth > deep[j].Depth })
	fmt.Fprintf(w, "\nmost nested (levels, at the deepest statement):")
	for i, f := range deep {
		if i >= top && f.Depth <= deepNesting {
			break
		}
		fmt.Fprintf(w, " %s %d (%s);", f.Name, f.Depth, f.At)
	}

	fmt.Fprintf(w, "\ndoc comments over %d lines:", longDoc)
	for _, d := range st.Docs {
		if d.Lines > longDoc {
			fmt.Fprintf(w, " %s %s %d;", d.Pos, d.Of, d.Lines)
		}
	}
	fmt.Fprintf(w, "\nretry loops:")
	for _, r := range st.Retries {
		fmt.Fprintf(w, " %s %s (%s);", r.Pos, r.Func, r.Why)
	}
	fmt.Fprintln(w)
	if names {
		for _, n := range st.Exported {
			fmt.Fprintf(w, "exported %s %s\n", n.Kind, n.Name)
		}
	}
}
