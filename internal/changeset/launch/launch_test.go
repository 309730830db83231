package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/changeset"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
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
			mode, _, err := ChooseMode(tc.want, tc.capable, why, tc.paths)
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

// fakeEngine is the engine as Prepare sees it: what it can mount, and what
// releasing a changeset does.
type fakeEngine struct {
	overlay  Overlay
	release  error
	released []string
}

func (f *fakeEngine) OverlayCapable(context.Context) (Overlay, error) { return f.overlay, nil }

func (f *fakeEngine) ReleaseChangeset(_ context.Context, id string) error {
	f.released = append(f.released, id)
	return f.release
}

// setup makes a workspace with one file and a store of its own, and
// returns the workspace, a profile whose workspace is in mode changeset,
// and the store.
func setup(t *testing.T) (string, *profile.Profile, changeset.Store) {
	t.Helper()
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "a.txt"), []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", filepath.Join(dir, "home"))
	t.Setenv("XDG_STATE_HOME", filepath.Join(dir, "state"))
	t.Setenv(EnvMode, "")
	t.Setenv(hostinfo.EnvMounts, "")
	p := &profile.Profile{Workspace: profile.Workspace{Target: "/workspace", Mode: profile.ModeChangeset}, Meta: profile.Meta{File: "builtin:standard"}}
	store, err := changeset.DefaultStore()
	if err != nil {
		t.Fatal(err)
	}
	return ws, p, store
}

// A new changeset where the engine cannot mount an overlay is a copy: the
// workspace goes into the sandbox's volume and comes back to the
// changeset's tree; Finish seals it and says what comes next; a resume
// releases it from the engine, starts from the tree, and Abandon seals it
// again.
func TestPrepareCopyFinishResume(t *testing.T) {
	ws, p, _ := setup(t)
	eng := &fakeEngine{overlay: Overlay{Why: "remote"}}
	var w bytes.Buffer
	cs, err := Prepare(context.Background(), eng, p, ws, "", &w)
	if err != nil {
		t.Fatal(err)
	}
	id, tree := cs.cs.ID, cs.cs.TreeDir(changeset.WorkspaceMount)
	want := []VolumeCopy{{Volume: "changeset-workspace", From: ws, To: tree}}
	if got := cs.VolumeCopies(); !slices.Equal(got, want) {
		t.Errorf("copies = %v, want %v", got, want)
	}
	var h generator.Host
	cs.Adjust(&h)
	if h.Changeset == nil || h.Changeset.ID != id || h.Changeset.Mode != generator.ChangesetCopy || len(h.Changeset.Mounts) != 1 {
		t.Errorf("host changeset = %+v", h.Changeset)
	}
	// What the engine copies back: the workspace and one new file.
	for name, content := range map[string]string{"a.txt": "a\n", "b.txt": "b\n"} {
		if err := os.WriteFile(filepath.Join(tree, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(filepath.Join(tree, "a.txt"), time.Now(), mtime(t, filepath.Join(ws, "a.txt"))); err != nil {
		t.Fatal(err)
	}
	if cs.Wrote() {
		t.Error("a copy wrote to its changeset before it was copied back")
	}
	if err := cs.Finish(&w, false); err != nil {
		t.Fatal(err)
	}
	if got, want := w.String(), "propio-sandbox: changeset "+id+" made (1 change, copy); the originals are untouched\n"; !strings.HasPrefix(got, want) {
		t.Errorf("finish wrote %q, want it to start with %q", got, want)
	}
	if !strings.Contains(w.String(), "propio-sandbox:   resume:  propio-sandbox run --changeset --resume "+id+"\n") {
		t.Errorf("finish wrote %q, without how to resume", w.String())
	}

	w.Reset()
	cs, err = Prepare(context.Background(), eng, p, ws, id[:len(id)-2], &w)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(eng.released, []string{id}) {
		t.Errorf("released %v, want %s", eng.released, id)
	}
	if got := cs.VolumeCopies(); len(got) != 1 || got[0].From != tree {
		t.Errorf("a resumed copy starts from %v, want the tree %s", got, tree)
	}
	if w.Len() > 0 {
		t.Errorf("resume warned: %s", w.String())
	}
	if err := cs.Abandon(); err != nil {
		t.Fatal(err)
	}
	if cs.cs.State != changeset.StateReady {
		t.Errorf("abandoned resume: state %s, want ready", cs.cs.State)
	}
}

// A run that changed nothing keeps no changeset, and says so in one line.
func TestFinishEmpty(t *testing.T) {
	ws, p, store := setup(t)
	eng := &fakeEngine{overlay: Overlay{Why: "remote"}}
	cs, err := Prepare(context.Background(), eng, p, ws, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// What the engine copies back: the workspace as it was.
	a := filepath.Join(cs.cs.TreeDir(changeset.WorkspaceMount), "a.txt")
	if err := os.WriteFile(a, []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(a, time.Now(), mtime(t, filepath.Join(ws, "a.txt"))); err != nil {
		t.Fatal(err)
	}
	var w bytes.Buffer
	if err := cs.Finish(&w, false); err != nil {
		t.Fatal(err)
	}
	if got, want := w.String(), "propio-sandbox: the sandbox changed nothing; no changeset kept\n"; got != want {
		t.Errorf("finish wrote %q, want %q", got, want)
	}
	if list, err := store.List(); err != nil || len(list) != 0 {
		t.Errorf("the store holds %d changesets (%v), want none", len(list), err)
	}
	if _, err := os.Stat(cs.cs.Dir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the changeset's directory remains: %v", err)
	}
}

func mtime(t *testing.T, p string) time.Time {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.ModTime()
}

// Resuming a changeset fails with a hint, and leaves it as it was, when a
// live sandbox writes to it, when the engine cannot mount its overlay, and
// when no changeset has the id.
func TestPrepareResumeRefused(t *testing.T) {
	ws, p, store := setup(t)
	mounts := []changeset.Mount{{Name: changeset.WorkspaceMount, Source: ws, Target: "/workspace"}}
	ready := func(mode changeset.Mode) *changeset.Changeset {
		c, err := store.Create(ws, "builtin:standard", mode, mounts)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Seal(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(c.Created.Truncate(time.Second).Add(time.Second))) // ids differ
		return c
	}
	cp, ov := ready(changeset.ModeCopy), ready(changeset.ModeOverlay)
	tests := map[string]struct {
		eng  *fakeEngine
		id   string
		err  string
		hint string
	}{
		"in use": {&fakeEngine{release: fmt.Errorf("sandbox x writes to it: %w", ErrInUse)}, cp.ID,
			"sandbox x writes to it: the changeset is in use", "`propio-sandbox ls` lists the sandboxes"},
		"overlay here": {&fakeEngine{overlay: Overlay{Why: "remote"}}, ov.ID,
			"changeset " + ov.ID + " is an overlay, and the engine cannot mount one here: remote", "resume it where it was made"},
		"no such": {&fakeEngine{}, "19990101", "no such changeset", "`propio-sandbox changes` to list"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Prepare(context.Background(), tc.eng, p, ws, tc.id, io.Discard)
			var h interface{ Hints() []string }
			switch {
			case err == nil || !strings.Contains(err.Error(), tc.err):
				t.Fatalf("err = %v, want %q", err, tc.err)
			case !errors.As(err, &h) || !strings.Contains(strings.Join(h.Hints(), "\n"), tc.hint):
				t.Errorf("hints of %v: want %q", err, tc.hint)
			}
		})
	}
	for _, c := range []*changeset.Changeset{cp, ov} {
		if got, err := store.Get(c.ID); err != nil || got.State != changeset.StateReady {
			t.Errorf("changeset %s after refused resumes: %v, %v", c.ID, got, err)
		}
	}
}

// The resume of a copy whose last run's launcher was killed warns that
// what that run did is lost, and starts from the sources.
func TestPrepareResumeKilledCopy(t *testing.T) {
	ws, p, store := setup(t)
	c, err := store.Create(ws, "builtin:standard", changeset.ModeCopy, []changeset.Mount{{Name: changeset.WorkspaceMount, Source: ws, Target: "/workspace"}})
	if err != nil {
		t.Fatal(err)
	}
	var w bytes.Buffer
	cs, err := Prepare(context.Background(), &fakeEngine{}, p, ws, c.ID, &w)
	if err != nil {
		t.Fatal(err)
	}
	if want := "propio-sandbox: warning: the last run of changeset " + c.ID + " did not finish"; !strings.HasPrefix(w.String(), want) {
		t.Errorf("warned %q, want %q", w.String(), want)
	}
	if got := cs.VolumeCopies(); len(got) != 1 || got[0].From != ws {
		t.Errorf("copies = %v, want one from the workspace", got)
	}
	// Nothing to seal: it stays as the killed run left it.
	if err := cs.Abandon(); err != nil {
		t.Fatal(err)
	}
}

// What a copy's sandbox wrote and could not be copied back is lost: a new
// changeset is removed.
func TestFinishCopyFailed(t *testing.T) {
	ws, p, _ := setup(t)
	cs, err := Prepare(context.Background(), &fakeEngine{}, p, ws, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = cs.Finish(io.Discard, true)
	if want := "what the sandbox wrote is lost; changeset " + cs.cs.ID + " is removed"; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %q", err, want)
	}
	if _, err := os.Stat(cs.cs.Dir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the changeset's directory is still there: %v", err)
	}
}

func TestWanted(t *testing.T) {
	for v, want := range map[string]string{"": "auto", " auto ": "auto", "copy": "copy", "overlay": "overlay"} {
		t.Setenv(EnvMode, v)
		if got, err := Wanted(); err != nil || got != want {
			t.Errorf("%s=%q: %q, %v; want %q", EnvMode, v, got, err, want)
		}
	}
	t.Setenv(EnvMode, "bogus")
	_, err := Wanted()
	var me *ModeError
	if !errors.As(err, &me) || err.Error() != `PROPIO_SANDBOX_CHANGESET_MODE="bogus": want overlay, copy or auto` ||
		!slices.Equal(me.Hints(), []string{"unset it to let propio-sandbox choose"}) {
		t.Errorf("err = %v", err)
	}
}
