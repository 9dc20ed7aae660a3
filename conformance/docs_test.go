package conformance_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/holdfast/holdfast/conformance"
)

// TestDocsCounts: every count of the suite's properties and of the fake's
// deliberate bugs that the docs state is the count the code has, and each
// of these docs states the bug count.
func TestDocsCounts(t *testing.T) {
	lock, all := conformance.PropertyCounts()
	bugs := regexp.MustCompile(`fake store with (\d+)`)
	props := regexp.MustCompile(`\b(\d+) (?:lock )?properties( in all)?\b`)
	for _, doc := range []string{"README.md", "docs/GUARDS.md", "docs/DESIGN.md", "conformance/doc.go"} {
		b, err := os.ReadFile(filepath.Join("..", doc))
		if err != nil {
			t.Fatal(err)
		}
		ms := bugs.FindAllSubmatch(b, -1)
		if len(ms) == 0 {
			t.Errorf("%s no longer states the number of the fake's bugs (%q)", doc, bugs)
		}
		for _, m := range ms {
			if n, _ := strconv.Atoi(string(m[1])); n != len(brokenFakes) {
				t.Errorf("%s says %q: the fake has %d deliberate bugs", doc, m[0], len(brokenFakes))
			}
		}
		for _, m := range props.FindAllSubmatch(b, -1) {
			what, want := "lock properties", lock
			if len(m[2]) > 0 {
				what, want = "properties in all", all
			}
			if n, _ := strconv.Atoi(string(m[1])); n != want {
				t.Errorf("%s says %q: the suite has %d %s", doc, m[0], want, what)
			}
		}
	}
}
