package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
)

// otherRow is a row of a scenario with rows of its own.
type otherRow struct {
	Scenario string `json:"scenario"`
	Errors   int    `json:"errors"`
}

// TestRegisterScenario: a scenario registered from outside the built-in
// list is known by name, runs with its quick settings under Options.Quick,
// streams its own rows through OnOther, counts their errors in the Summary,
// and prints them with its table function; registering a name twice panics.
func TestRegisterScenario(t *testing.T) {
	saved := registry
	defer func() { registry = saved }()
	registry = slices.Clone(registry)
	registerScenario(scenarioSpec{
		name: "test-other",
		run: func(r *runner, ctx context.Context) error {
			// Repeats stands for the scenario's own setting: the number
			// of failed rows it reports.
			r.emitOther(otherRow{"test-other", r.opts.Repeats}, 0, r.opts.Repeats)
			return nil
		},
		quick: func(o Options) Options { o.Repeats = 0; return o },
		table: func(w io.Writer, rows []any) error {
			for _, row := range rows {
				if o, ok := row.(otherRow); ok {
					fmt.Fprintf(w, "test-other row: %d errors\n", o.Errors)
				}
			}
			return nil
		},
	})
	if !IsScenario("test-other") || !slices.Contains(ScenarioNames(), "test-other") || !IsScenario(ScenarioAll) || IsScenario("nope") {
		t.Fatalf("names: %v", ScenarioNames())
	}
	var streamed []any
	sum, err := Run(context.Background(), nil, "test-other", Options{Repeats: 2, OnOther: func(row any) { streamed = append(streamed, row) }})
	if err != nil {
		t.Fatal(err)
	}
	if !sum.Failed() || sum.Errors != 2 || len(sum.Other) != 1 || len(streamed) != 1 {
		t.Errorf("without quick: %+v, streamed %v", sum, streamed)
	}
	var out bytes.Buffer
	if err := WriteTable(&out, sum); err != nil || !strings.Contains(out.String(), "test-other row: 2 errors") {
		t.Errorf("table (%v):\n%s", err, out.String())
	}
	sum, err = Run(context.Background(), nil, "test-other", Options{Repeats: 2, Quick: true})
	if err != nil || sum.Failed() || len(sum.Other) != 1 {
		t.Errorf("quick: %+v, %v", sum, err)
	}
	defer func() {
		if recover() == nil {
			t.Error("registering a name twice did not panic")
		}
	}()
	registerScenario(scenarioSpec{name: ScenarioLock})
}
