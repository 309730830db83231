package profile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A document the schema accepted is remembered, and only such a one: a
// document that differs, even by one value, is checked, and what the
// schema refuses is said each time.
func TestAcceptedProfilesRemembered(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	marks := func() int {
		dir, _ := os.UserCacheDir()
		ents, _ := os.ReadDir(filepath.Join(dir, "propio-sandbox", "accepted-profiles"))
		return len(ents)
	}
	good := "image: alpine\nnetwork: {mode: none}\n"
	for range 2 {
		if _, err := Parse("good.yaml", t.TempDir(), strings.NewReader(good)); err != nil {
			t.Fatalf("a valid profile: %v", err)
		}
	}
	if n := marks(); n != 1 {
		t.Fatalf("%d documents remembered after one valid one, read twice; want 1", n)
	}
	bad := "image: alpine\nnetwork: {mode: nowhere}\n"
	for range 2 {
		_, err := Parse("bad.yaml", t.TempDir(), strings.NewReader(bad))
		if err == nil || !strings.Contains(err.Error(), "bad.yaml:2:") {
			t.Fatalf("an invalid profile, read again: %v; want the schema's error at its line", err)
		}
	}
	if n := marks(); n != 1 {
		t.Errorf("%d documents remembered; want the invalid one not remembered", n)
	}
}
