// Command benchdocs reads the output of `holdfast bench --json` and writes
// the plots (PNG) and tables of docs/BENCHMARKS.md:
//
//	go run ./cmd/holdfast/internal/cmd/benchdocs [-out docs/bench] [-doc docs/BENCHMARKS.md] [-label text] file.jsonl...
//
// The tables and plot links replace the text between the markers
// <!-- bench:begin --> and <!-- bench:end --> in the document; the rest of
// it is kept. `make bench-plots` runs it on docs/bench/*.jsonl.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/holdfast/holdfast/cmd/holdfast/internal/benchdocs"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "benchdocs:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("benchdocs", flag.ContinueOnError)
	out := fs.String("out", "docs/bench", "directory for the PNG plots")
	doc := fs.String("doc", "docs/BENCHMARKS.md", "markdown document to splice the tables into (empty: print them)")
	label := fs.String("label", "", "label shown above the tables and in every plot title")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: no input files (the JSON lines of `holdfast bench --json`)", benchdocs.ErrBadInput)
	}
	d, err := benchdocs.LoadFiles(fs.Args())
	if err != nil {
		return err
	}
	res, err := benchdocs.Generate(d, benchdocs.Options{Dir: *out, Label: *label, Sources: fs.Args()})
	if err != nil {
		return err
	}
	for _, n := range res.Notes {
		fmt.Fprintln(os.Stderr, "benchdocs: note:", n)
	}
	if *doc == "" {
		fmt.Print(res.Markdown)
		return nil
	}
	old, err := os.ReadFile(*doc)
	if err != nil {
		return err
	}
	updated, err := benchdocs.Splice(string(old), res.Markdown)
	if err != nil {
		return fmt.Errorf("%s: %w", *doc, err)
	}
	if err := os.WriteFile(*doc, []byte(updated), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "benchdocs: %d plots in %s, tables in %s\n", len(res.Plots), *out, *doc)
	return nil
}
