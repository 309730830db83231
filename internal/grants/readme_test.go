package grants

import (
	"os"
	"regexp"
	"testing"
)

// TestREADMEExample: the grants file the README shows parses.
func TestREADMEExample(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(version: 1\nworkspace: /home/me/proj\ngrants:\n.*?)```").FindSubmatch(data)
	if m == nil {
		t.Fatal("the README shows no grants file")
	}
	s, err := Parse("README.md", m[1])
	if err != nil || len(s.Grants) != 2 {
		t.Fatalf("the README's grants file: %v, %+v", err, s)
	}
}
