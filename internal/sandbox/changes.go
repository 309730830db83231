package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/propio/propio-sandbox/internal/changeset"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// Errors of the changeset commands a caller tells apart.
var (
	// ErrChangesetAmbiguous: an id prefix names more than one changeset.
	ErrChangesetAmbiguous = changeset.ErrAmbiguous
	// ErrChangesetRunning: the changeset's sandbox is running.
	ErrChangesetRunning = changeset.ErrRunning
)

// NoChangesetError: no changeset was named, and the workspace (or a
// workspace that holds it) has none.
type NoChangesetError struct {
	Workspace string
	Others    bool // there are changesets, of other directories
	// Empty: the workspace's changesets hold no change left to apply
	// (all of it applied), so none is picked.
	Empty bool
}

func (e *NoChangesetError) Error() string {
	if e.Empty {
		return "no changeset for " + e.Workspace + " holds a change left to apply"
	}
	return "no changeset for " + e.Workspace
}

// PathError: a PATH argument is not in any directory of the changeset.
type PathError struct{ Err error }

func (e *PathError) Error() string { return e.Err.Error() }
func (e *PathError) Unwrap() error { return e.Err }

// NoChangeError: a PATH argument names no change of the changeset.
type NoChangeError struct{ Path, ID string }

func (e *NoChangeError) Error() string {
	return fmt.Sprintf("%s: no change there in changeset %s", e.Path, e.ID)
}

// Changeset is a changeset of the store, as the commands that review,
// apply and discard it see it.
type Changeset struct{ c *changeset.Changeset }

// ID is the changeset's id.
func (c *Changeset) ID() string { return c.c.ID }

// Running tells whether a sandbox is using the changeset (or its launcher
// was killed before it could seal it).
func (c *Changeset) Running() bool { return c.c.State == changeset.StateRunning }

// Mounts are the directories of the host whose changes the changeset holds.
func (c *Changeset) Mounts() []changeset.Mount { return c.c.Mounts }

// ChangesetListing is one changeset in `changes --json`: fields are only
// ever added.
type ChangesetListing struct {
	ID        string            `json:"id"`
	Workspace string            `json:"workspace"`
	Profile   string            `json:"profile"`
	Created   time.Time         `json:"created"`
	Mode      changeset.Mode    `json:"mode"`
	State     changeset.State   `json:"state"`
	Mounts    []changeset.Mount `json:"mounts"`
	Files     *int              `json:"files"` // changed paths not applied yet; null while running
}

// ListChangesets lists the changesets of the store, oldest first.
func ListChangesets() ([]ChangesetListing, error) {
	st, err := changeset.DefaultStore()
	if err != nil {
		return nil, err
	}
	list, err := st.List()
	if err != nil {
		return nil, err
	}
	rows := []ChangesetListing{}
	for _, c := range list {
		row := ChangesetListing{ID: c.ID, Workspace: c.Workspace, Profile: c.Profile, Created: c.Created, Mode: c.Mode, State: c.State, Mounts: c.Mounts}
		if c.State != changeset.StateRunning {
			if cs, err := c.Changes(); err == nil {
				n := len(cs)
				row.Files = &n
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// FindChangeset picks the changeset a review command works on and the
// paths it is limited to, from its positional arguments:
//
// The first argument is a changeset ID (or a unique prefix of one) when it
// is not an existing file or directory and some changeset's id starts with
// it; every other argument is a PATH. Without an ID, the newest changeset
// of the current directory's workspace (or of the workspace the current
// directory is in). `./NAME` always means a path.
func FindChangeset(args []string) (*Changeset, []string, error) {
	st, err := changeset.DefaultStore()
	if err != nil {
		return nil, nil, err
	}
	if len(args) > 0 && looksLikeID(args[0]) {
		if _, err := os.Lstat(args[0]); err != nil {
			c, err := st.Get(args[0])
			if err == nil {
				return &Changeset{c}, args[1:], nil
			}
			if !errors.Is(err, changeset.ErrNotFound) {
				return nil, nil, err
			}
		}
	}
	ws, err := hostinfo.Workspace()
	if err != nil {
		return nil, nil, err
	}
	c, err := latestFor(st, ws)
	if err != nil {
		return nil, nil, err
	}
	return &Changeset{c}, args, nil
}

// looksLikeID: ids are 20261122-064500-3f9a; a prefix has only digits,
// dashes and hex letters, and starts with a digit.
func looksLikeID(s string) bool {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return false
	}
	return strings.Trim(s, "0123456789abcdef-") == ""
}

// latestFor is the newest changeset of ws, or of the nearest workspace
// that holds ws, that has something to review: an empty one (all of it
// applied) is never picked.
func latestFor(st changeset.Store, ws string) (*changeset.Changeset, error) {
	list, err := st.List()
	if err != nil {
		return nil, err
	}
	var best *changeset.Changeset
	empty := false
	for _, c := range list { // oldest first: the newest of the longest wins
		if c.Workspace == ws || strings.HasPrefix(ws, strings.TrimSuffix(c.Workspace, string(filepath.Separator))+string(filepath.Separator)) {
			if c.Empty() {
				empty = true
				continue
			}
			if best == nil || len(c.Workspace) >= len(best.Workspace) {
				best = c
			}
		}
	}
	if best == nil {
		return nil, &NoChangesetError{Workspace: ws, Others: len(list) > 0, Empty: empty}
	}
	return best, nil
}

// Changes are changes of a changeset not applied yet: all of them, or
// those some paths name.
type Changes struct {
	c    *changeset.Changeset
	list []changeset.Change
}

// Changes reads the changeset's changes not applied yet; a changeset that
// is not sealed (its sandbox runs, or its launcher was killed) has none
// to read.
func (c *Changeset) Changes() (Changes, error) {
	list, err := c.c.Changes()
	return Changes{c.c, list}, err
}

// Len is how many changes there are.
func (cs Changes) Len() int { return len(cs.list) }

// Select keeps the changes paths name: relative to the current directory,
// /TARGET/PATH as the sandbox saw it, or MOUNT:PATH. None keeps them all.
// A PATH that names no change is an error (*PathError, *NoChangeError): a
// mistyped path would otherwise look like "nothing to review".
func (cs Changes) Select(paths []string) (Changes, error) {
	if len(paths) == 0 {
		return cs, nil
	}
	cwd, _ := hostinfo.Workspace()
	var refs []changeset.Ref
	for _, p := range paths {
		ref, err := cs.c.Resolve(p, cwd)
		if err != nil {
			return Changes{}, &PathError{err}
		}
		if len(changeset.Select(cs.list, []changeset.Ref{ref})) == 0 {
			return Changes{}, &NoChangeError{Path: p, ID: cs.c.ID}
		}
		refs = append(refs, ref)
	}
	return Changes{cs.c, changeset.Select(cs.list, refs)}, nil
}

// Diff is what a review shows of some changes.
type Diff struct {
	c     *changeset.Changeset
	files []changeset.FileDiff
}

// Diff compares each change with the original.
func (cs Changes) Diff() (Diff, error) {
	fds, err := cs.c.Diff(cs.list)
	return Diff{cs.c, fds}, err
}

// WriteUnified writes the diff as git does: a unified diff with three
// lines of context.
func (d Diff) WriteUnified(w io.Writer) error { return changeset.WriteUnified(w, d.files) }

// WriteStat writes a diffstat width columns wide: one line per file and a
// summary.
func (d Diff) WriteStat(w io.Writer, width int) error { return changeset.WriteStat(w, d.files, width) }

// Report is the diff as `diff --json` prints it.
func (d Diff) Report() changeset.Report { return d.c.NewReport(d.files) }

// Conflicts are the paths, as the diff shows them, whose original changed
// since the run started: apply refuses them without Force.
func (d Diff) Conflicts() []string {
	var out []string
	for _, fd := range d.files {
		if fd.Conflict {
			out = append(out, fd.Display)
		}
	}
	return out
}
