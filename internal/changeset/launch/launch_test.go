package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/changeset"
)

func TestChooseMode(t *testing.T) {
	t.Parallel()
	ok := []string{"/home/me/.local/state/propio-sandbox/changesets", "/home/me/project"}
	odd := []string{"/home/me/.local/state/propio-sandbox/changesets", "/home/me/a,b"}
	tests := map[string]struct {
		want    string
		capable bool
		paths   []string
		mode    changeset.Mode
		err     string
	}{
		"auto, capable":              {"auto", true, ok, changeset.ModeOverlay, ""},
		"auto, not capable":          {"auto", false, ok, changeset.ModeCopy, ""},
		"auto, a comma in a path":    {"auto", true, odd, changeset.ModeCopy, ""},
		"copy, capable":              {"copy", true, ok, changeset.ModeCopy, ""},
		"overlay, capable":           {"overlay", true, ok, changeset.ModeOverlay, ""},
		"overlay, not capable":       {"overlay", false, ok, "", "PROPIO_SANDBOX_CHANGESET_MODE=overlay, but the engine cannot mount an overlay here: remote"},
		"overlay, a comma in a path": {"overlay", true, odd, "", "/home/me/a,b has a comma or colon"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			why := ""
			if !tc.capable {
				why = "remote"
			}
			mode, _, err := chooseMode(tc.want, tc.capable, why, tc.paths)
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("err = %v, want %q", err, tc.err)
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case mode != tc.mode:
				t.Errorf("mode = %q, want %q", mode, tc.mode)
			}
		})
	}
}

// A file the agent rewrote with the same size in its original's second
// looks unchanged to a stat with whole-second mtimes: settleRacyMtimes
// makes it differ; an equal one gets the original's exact mtime; an
// original older than the run is not read.
func TestSettleRacyMtimes(t *testing.T) {
	t.Parallel()
	src, tree := t.TempDir(), t.TempDir()
	run := time.Now()
	recent := run.Truncate(time.Second).Add(123456789)
	old := run.Add(-time.Hour).Truncate(time.Second).Add(5)
	for _, f := range []struct {
		name, orig, copy string
		mtime            time.Time
	}{
		{"rewritten", "aaaa", "bbbb", recent},
		{"same", "cccc", "cccc", recent},
		{"old", "dddd", "eeee", old},
	} {
		write := func(dir, content string, mt time.Time) {
			p := filepath.Join(dir, f.name)
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, mt, mt); err != nil {
				t.Fatal(err)
			}
		}
		write(src, f.orig, f.mtime)
		write(tree, f.copy, f.mtime.Truncate(time.Second))
	}
	if err := settleRacyMtimes(tree, src, run); err != nil {
		t.Fatal(err)
	}
	mtime := func(dir, name string) time.Time {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return st.ModTime()
	}
	if got := mtime(tree, "rewritten"); got.Equal(recent.Truncate(time.Second)) || got.Equal(recent) {
		t.Errorf("rewritten: mtime %v, want one that differs from the original's %v and its second", got, recent)
	}
	if got := mtime(tree, "same"); !got.Equal(recent) {
		t.Errorf("same: mtime %v, want the original's %v", got, recent)
	}
	if got := mtime(tree, "old"); !got.Equal(old.Truncate(time.Second)) {
		t.Errorf("old: mtime %v, want it left at %v", got, old.Truncate(time.Second))
	}
}
