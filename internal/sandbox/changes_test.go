package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/changeset"
)

func TestLooksLikeID(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"20261122-064500-3f9a": true, "2026": true, "2026112": true,
		"": false, "src": false, "a2026": false, "2026/x": false, "./2026": false, "20261122-06450G": false,
	} {
		if got := looksLikeID(s); got != want {
			t.Errorf("looksLikeID(%q) = %v, want %v", s, got, want)
		}
	}
}

// store makes a store of its own under a temporary XDG_STATE_HOME, and
// changesets of it with mk (sealed, a copy holding what result has over
// the workspace).
func store(t *testing.T) (dir string, mk func(ws string, result map[string]string) *changeset.Changeset) {
	t.Helper()
	dir = t.TempDir()
	t.Setenv("HOME", filepath.Join(dir, "home"))
	t.Setenv("XDG_STATE_HOME", filepath.Join(dir, "state"))
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	st, err := changeset.DefaultStore()
	if err != nil {
		t.Fatal(err)
	}
	return dir, func(ws string, result map[string]string) *changeset.Changeset {
		t.Helper()
		if err := os.MkdirAll(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		c, err := st.Create(ws, "builtin:standard", changeset.ModeCopy, []changeset.Mount{{Name: changeset.WorkspaceMount, Source: ws, Target: "/workspace"}})
		if err != nil {
			t.Fatal(err)
		}
		tree := c.TreeDir(changeset.WorkspaceMount)
		for name, content := range result {
			p := filepath.Join(tree, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Seal(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(c.Created.Truncate(time.Second).Add(time.Second))) // ids differ
		return c
	}
}

// FindChangeset takes the first argument as an id (or a prefix) when no
// file has that name; else it is a path, and the changeset is the newest
// of the workspace, or of the nearest one that holds it, that is not empty.
func TestFindChangeset(t *testing.T) {
	dir, mk := store(t)
	ws, other := filepath.Join(dir, "ws"), filepath.Join(dir, "other")
	old := mk(ws, map[string]string{"a": "a"})
	newest := mk(ws, map[string]string{"b": "b"})
	elsewhere := mk(other, map[string]string{"c": "c"})
	mk(ws, nil) // newer still, and empty: never picked without an id
	emptyOnly := filepath.Join(dir, "empty")
	mk(emptyOnly, nil)
	sub := filepath.Join(ws, "sub")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	find := func(cwd string, args ...string) (string, []string, error) {
		t.Helper()
		t.Chdir(cwd)
		c, rest, err := FindChangeset(args)
		if err != nil {
			return "", nil, err
		}
		return c.ID(), rest, nil
	}
	tests := map[string]struct {
		cwd  string
		args []string
		id   string
		rest []string
	}{
		"the newest of the workspace": {ws, nil, newest.ID, nil},
		"from a directory inside":     {sub, []string{"x"}, newest.ID, []string{"x"}},
		"by id":                       {ws, []string{old.ID, "a"}, old.ID, []string{"a"}},
		"by a prefix":                 {ws, []string{elsewhere.ID[:len(elsewhere.ID)-1]}, elsewhere.ID, []string{}},
		"no such id: a path":          {ws, []string{"19990101"}, newest.ID, []string{"19990101"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			id, rest, err := find(tc.cwd, tc.args...)
			if err != nil || id != tc.id || !slices.Equal(rest, tc.rest) {
				t.Errorf("%v: %s %q, %v; want %s %q", tc.args, id, rest, err, tc.id, tc.rest)
			}
		})
	}
	t.Run("a file named like an id is a path", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(ws, old.ID), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(filepath.Join(ws, old.ID))
		if id, rest, err := find(ws, old.ID); err != nil || id != newest.ID || !slices.Equal(rest, []string{old.ID}) {
			t.Errorf("%s %q, %v; want %s", id, rest, err, newest.ID)
		}
	})
	t.Run("ambiguous", func(t *testing.T) {
		if _, _, err := find(ws, old.ID[:4]); !errors.Is(err, ErrChangesetAmbiguous) {
			t.Errorf("err = %v, want ErrChangesetAmbiguous", err)
		}
	})
	t.Run("only empty ones here", func(t *testing.T) {
		var none *NoChangesetError
		if _, _, err := find(emptyOnly); !errors.As(err, &none) || !none.Empty || err.Error() != "no changeset for "+emptyOnly+" holds a change left to apply" {
			t.Errorf("err = %v, want no changeset with a change left", err)
		}
	})
	t.Run("none here", func(t *testing.T) {
		var none *NoChangesetError
		if _, _, err := find(dir); !errors.As(err, &none) || !none.Others || err.Error() != "no changeset for "+dir {
			t.Errorf("err = %v, want no changeset for %s, with others", err, dir)
		}
	})
}

// Select keeps the changes PATHs name, and refuses a PATH outside the
// changeset's directories or one that names no change.
func TestSelect(t *testing.T) {
	dir, mk := store(t)
	ws := filepath.Join(dir, "ws")
	c := &Changeset{mk(ws, map[string]string{"a": "a", "d/b": "b"})}
	t.Chdir(ws)
	cs, err := c.Changes()
	if err != nil || cs.Len() != 3 { // a, d and d/b
		t.Fatalf("%d changes, %v", cs.Len(), err)
	}
	sel, err := cs.Select([]string{"workspace:d"})
	if err != nil || sel.Len() != 2 {
		t.Errorf("workspace:d: %d changes, %v; want 2", sel.Len(), err)
	}
	var pe *PathError
	if _, err := cs.Select([]string{"/elsewhere/x"}); !errors.As(err, &pe) {
		t.Errorf("/elsewhere/x: err = %v, want a *PathError", err)
	}
	var nc *NoChangeError
	if _, err := cs.Select([]string{"a", "nothing"}); !errors.As(err, &nc) || err.Error() != "nothing: no change there in changeset "+c.ID() {
		t.Errorf("nothing: err = %v, want a *NoChangeError", err)
	}
}

// Apply writes the changes, and the guard's sweep puts aside what it wrote
// that the host's git would run.
func TestApplySweeps(t *testing.T) {
	dir, mk := store(t)
	ws := filepath.Join(dir, "ws")
	c := &Changeset{mk(ws, map[string]string{"a": "a", ".git/HEAD": "ref: refs/heads/main\n", ".git/refs/heads/main": "0\n", ".git/hooks/pre-commit": "#!/bin/sh\necho hi\n"})}
	cs, err := c.Changes()
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.Apply(ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Removed || res.Applied != cs.Len() || res.Remaining != 0 || len(res.Conflicts) != 0 {
		t.Errorf("applied: %+v", res)
	}
	if got, err := os.ReadFile(filepath.Join(ws, "a")); err != nil || string(got) != "a" {
		t.Errorf("a: %q, %v", got, err)
	}
	if len(res.Swept) != 1 || len(res.Swept[0].Items) == 0 || !strings.Contains(res.Swept[0].Items[0].String(), "pre-commit") {
		t.Errorf("swept: %+v", res.Swept)
	}
	if want := filepath.Join(dir, "state", "propio-sandbox", "quarantine"); res.Quarantine != want {
		t.Errorf("quarantine %s, want %s", res.Quarantine, want)
	}
	if _, err := os.Lstat(filepath.Join(ws, ".git", "hooks", "pre-commit")); err == nil {
		t.Error("the hook is still there")
	}
}

// Discard refuses a running changeset unless forced.
func TestDiscard(t *testing.T) {
	dir, mk := store(t)
	c := &Changeset{mk(filepath.Join(dir, "ws"), nil)}
	if err := c.c.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.Discard(false); !errors.Is(err, ErrChangesetRunning) {
		t.Errorf("err = %v, want ErrChangesetRunning", err)
	}
	if err := c.Discard(true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.c.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the changeset is still there: %v", err)
	}
}
