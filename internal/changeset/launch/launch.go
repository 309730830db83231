// Package launch is the life of the changeset a sandbox run writes to: it
// creates the changeset (or resumes one), chooses how it is realised (an
// overlay, or a copy the engine fills and empties), gives the generator the
// changeset's mounts and the engine its copies, and after the run seals it,
// or undoes it for a sandbox that did not run.
//
// It talks to the container engine only through Engine, and prints only to
// the writer it is given; what to do about its errors is in their Hints.
package launch

import (
	"context"
	"errors"
	"fmt"
	"github.com/propio/propio-sandbox/internal/backend"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/changeset"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
)

// EnvMode forces how a changeset is realised: overlay, copy or auto (the
// default: an overlay where the engine can mount one of this host's
// directories, else a copy).
const EnvMode = "PROPIO_SANDBOX_CHANGESET_MODE"

// command is the launcher's name, as hints show it.
const command = "propio-sandbox"

// Engine is what a changeset's launch needs of the container engine.
type Engine interface {
	// OverlayCapable tells whether the engine can mount an overlay of a
	// directory of this host, and how.
	OverlayCapable(ctx context.Context) (Overlay, error)
	// ReleaseChangeset makes sure that no sandbox writes to changeset id
	// before a run resumes it: it removes the sandboxes of launchers that
	// are gone; one of a live launcher is an error that Is ErrInUse.
	ReleaseChangeset(ctx context.Context, id string) error
}

// ErrInUse: a running sandbox of a live launcher writes to the changeset
// (the runtime's error, which backend.Runtime's ReleaseChangeset returns).
var ErrInUse = backend.ErrChangesetInUse

// Overlay says whether the engine can mount an overlay of a directory of
// this host for a sandbox, and how: the runtime's answer, as
// backend.Runtime gives it, so that a Runtime is an Engine.
type Overlay = backend.Overlay

// VolumeCopy fills a volume of the project with a host directory before the
// run, and copies the volume's content back to the host after it: the copy
// realisation of a changeset.
type VolumeCopy = backend.VolumeCopy

// Changeset is the changeset one run writes to.
type Changeset struct {
	cs      *changeset.Changeset
	resumed bool
	sealed  bool // resumed, and sealed before: a copy's tree holds the last result
	gen     *generator.Changeset
	copies  []VolumeCopy
}

// hinted is an error with what to do about it.
type hinted struct {
	err   error
	hints []string
}

func (e hinted) Error() string   { return e.err.Error() }
func (e hinted) Unwrap() error   { return e.err }
func (e hinted) Hints() []string { return e.hints }

func withHint(err error, hints ...string) error { return hinted{err, hints} }

// ModeError: PROPIO_SANDBOX_CHANGESET_MODE is neither overlay, copy nor
// auto; a mistake in how the launcher was called.
type ModeError struct{ Value string }

func (e *ModeError) Error() string {
	return fmt.Sprintf("%s=%q: want overlay, copy or auto", EnvMode, e.Value)
}

// Hints say what to do about it.
func (e *ModeError) Hints() []string { return []string{"unset it to let " + command + " choose"} }

// Wanted reads PROPIO_SANDBOX_CHANGESET_MODE: overlay, copy or auto. A
// value it does not know is a *ModeError.
func Wanted() (string, error) {
	v := strings.TrimSpace(os.Getenv(EnvMode))
	switch v {
	case "", "auto":
		return "auto", nil
	case generator.ChangesetOverlay, generator.ChangesetCopy:
		return v, nil
	}
	return "", &ModeError{v}
}

// mounts lists the directories of p in changeset mode, with their sources
// resolved; a source that is not a directory is a positioned error.
func mounts(p *profile.Profile, workspace string) ([]generator.ChangesetMount, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return nil, fmt.Errorf("finding home directory: %w", err)
	}
	h := generator.Host{Workspace: workspace, Home: home, PropioHome: hostinfo.PropioHome(), Exists: map[string]bool{}}
	index := map[string]int{}
	for i, m := range p.Mounts {
		src := generator.MountSource(m, h)
		if _, err := os.Stat(src); err == nil {
			h.Exists[src] = true
		}
		index["mount-"+strconv.Itoa(i)] = i
	}
	mounts := generator.ChangesetMounts(p, h)
	var errs profile.List
	for i, m := range mounts {
		if m.Name == generator.WorkspaceMount {
			continue
		}
		idx := strconv.Itoa(index[m.Name])
		real, err := filepath.EvalSymlinks(m.Source)
		var st fs.FileInfo
		if err == nil {
			st, err = os.Stat(real)
		}
		switch {
		case err != nil:
			// The mounts preflight check, or the generator, says it better.
			continue
		case !st.IsDir():
			errs = append(errs, &profile.Error{
				Pos: p.Pos("mounts", idx, "source"), Field: "mounts[" + idx + "].source",
				Msg:  fmt.Sprintf("%s is not a directory, and mode changeset takes one", m.Source),
				Hint: "mount the directory that holds it, or use mode ro or rw",
			})
		}
		mounts[i].Source = real
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return mounts, nil
}

// Prepare creates the run's changeset of the profile p in workspace (or
// resumes the one whose id, or unique prefix of one, resume names) and
// chooses its realisation: an overlay where the engine can mount one of
// this host's directories, else a copy, unless PROPIO_SANDBOX_CHANGESET_MODE
// says which. Its warnings go to w. Nothing is left behind when it fails.
func Prepare(ctx context.Context, eng Engine, p *profile.Profile, workspace, resume string, w io.Writer) (*Changeset, error) {
	want, err := Wanted()
	if err != nil {
		return nil, err
	}
	mounts, err := mounts(p, workspace)
	if err != nil {
		return nil, err
	}
	if len(mounts) == 0 {
		return nil, errors.New("the profile has no directory in changeset mode (every mount in mode changeset is optional and missing)")
	}
	store, err := changeset.DefaultStore()
	if err != nil {
		return nil, err
	}
	if err := checkPlaces(p, mounts, store); err != nil {
		return nil, err
	}
	ov, err := eng.OverlayCapable(ctx)
	if err != nil {
		return nil, err
	}
	// Every path an overlay's options would hold.
	paths := []string{store.Dir}
	for _, m := range mounts {
		paths = append(paths, m.Source)
	}
	mode, why, err := ChooseMode(want, ov.OK, ov.Why, paths)
	if err != nil {
		return nil, err
	}
	l := &Changeset{}
	if resume != "" {
		err = l.resume(ctx, eng, store, resume, mounts, want, ov.OK, why, w)
	} else {
		err = l.create(store, workspace, p.Meta.File, mode, mounts)
	}
	if err != nil {
		return nil, err
	}
	if err := l.realise(mounts, ov.UserXattr); err != nil {
		l.Abandon()
		return nil, err
	}
	return l, nil
}

// checkPlaces refuses a changeset that would hold a mount point of
// PROPIO_SANDBOX_MOUNTS, or the store itself.
func checkPlaces(p *profile.Profile, mounts []generator.ChangesetMount, store changeset.Store) error {
	if p.Workspace.Mode == profile.ModeChangeset {
		// As for the profile's mounts (Check): a mount point inside would
		// show up in the changeset.
		extra, err := hostinfo.ExtraMounts(os.LookupEnv)
		if err != nil {
			return err // generate has said it already, with a hint
		}
		ws := filepath.Clean(p.Workspace.Target)
		for _, m := range extra {
			if m.Target != ws && fsutil.Within(ws, m.Target) {
				return withHint(fmt.Errorf("%s mounts %s inside the workspace (%s), whose mode is changeset: its mount point would become part of the changeset", hostinfo.EnvMounts, m.Target, ws),
					"mount it outside "+ws+", or run without --changeset")
			}
		}
	}
	for _, m := range mounts {
		if fsutil.Within(m.Source, store.Dir) || fsutil.Within(store.Dir, m.Source) {
			return withHint(fmt.Errorf("%s and the changeset store %s are one inside the other: a changeset of it would hold itself", m.Source, store.Dir),
				"keep XDG_STATE_HOME outside the directories in changeset mode")
		}
	}
	return nil
}

// resume takes the changeset id of store for this run, when it has the
// profile's mounts, its realisation can be had here, and no live sandbox
// writes to it.
func (l *Changeset) resume(ctx context.Context, eng Engine, store changeset.Store, id string, mounts []generator.ChangesetMount, want string, capable bool, why string, w io.Writer) error {
	cs, err := store.Get(id)
	switch {
	case errors.Is(err, changeset.ErrNotFound):
		return withHint(err, "run `"+command+" changes` to list the changesets there are")
	case errors.Is(err, changeset.ErrAmbiguous):
		return withHint(err, "give more of the id (`"+command+" changes` lists them)")
	case err != nil:
		return err
	}
	if err := sameMounts(cs, mounts); err != nil {
		return withHint(fmt.Errorf("changeset %s cannot be resumed with this profile: %w", cs.ID, err),
			"resume it with the profile it was made with ("+cs.Profile+"), from "+cs.Workspace)
	}
	switch {
	case want != "auto" && string(cs.Mode) != want:
		return fmt.Errorf("changeset %s is realised as %s, and %s=%s", cs.ID, cs.Mode, EnvMode, want)
	case cs.Mode == changeset.ModeOverlay && !capable:
		return withHint(fmt.Errorf("changeset %s is an overlay, and the engine cannot mount one here: %s", cs.ID, why),
			"resume it where it was made, with an engine on this host")
	}
	// A copy's tree is what the last run that finished left; a changeset
	// never sealed has none yet, and starts from the sources.
	_, err = os.Stat(filepath.Join(cs.Dir(), "changes.json"))
	l.sealed = err == nil
	if cs.State == changeset.StateRunning && cs.Mode == changeset.ModeCopy {
		fmt.Fprintf(w, "%s: warning: the last run of changeset %s did not finish (its launcher was killed); what it did in its copy is lost, the changeset goes on from the run before\n", command, cs.ID)
	}
	err = eng.ReleaseChangeset(ctx, cs.ID)
	if errors.Is(err, ErrInUse) {
		return withHint(err, "wait for that sandbox to end, or stop it (`"+command+" ls` lists the sandboxes)")
	}
	if err != nil {
		return err
	}
	if err := cs.Resume(); err != nil {
		return err
	}
	l.cs, l.resumed = cs, true
	return nil
}

// create makes a new changeset in store for this run.
func (l *Changeset) create(store changeset.Store, workspace, profileFile string, mode changeset.Mode, mounts []generator.ChangesetMount) error {
	var ms []changeset.Mount
	for _, m := range mounts {
		ms = append(ms, changeset.Mount{Name: m.Name, Source: m.Source, Target: m.Target})
	}
	cs, err := store.Create(workspace, profileFile, mode, ms)
	if err != nil {
		return err
	}
	l.cs = cs
	return nil
}

// realise gives each mount its overlay's directories, or its copies.
func (l *Changeset) realise(mounts []generator.ChangesetMount, userXattr bool) error {
	cs := l.cs
	l.gen = &generator.Changeset{ID: cs.ID, Mode: string(cs.Mode), UserXattr: userXattr}
	for _, m := range mounts {
		switch cs.Mode {
		case changeset.ModeOverlay:
			m.UpperDir, m.WorkDir = cs.UpperDir(m.Name), cs.WorkDir(m.Name)
			// The root of an overlay takes its owner and mode from the upper
			// directory's: the original's.
			if err := LikeRoot(m.UpperDir, m.Source); err != nil {
				return err
			}
		case changeset.ModeCopy:
			from := m.Source
			if l.sealed {
				from = cs.TreeDir(m.Name) // what the last run left
			}
			m.CopyIn, m.CopyOut = from, cs.TreeDir(m.Name) // for the project's extension
			l.copies = append(l.copies, VolumeCopy{Volume: "changeset-" + m.Name, From: from, To: cs.TreeDir(m.Name)})
		}
		l.gen.Mounts = append(l.gen.Mounts, m)
	}
	return nil
}

// ChooseMode picks a new changeset's realisation: what want (overlay, copy
// or auto) asks, an overlay when auto and the engine can mount one of these
// paths, else a copy. It returns why an overlay cannot be, if it cannot.
func ChooseMode(want string, capable bool, why string, paths []string) (changeset.Mode, string, error) {
	for _, p := range paths {
		if capable && strings.ContainsAny(p, ",:") {
			capable, why = false, fmt.Sprintf("%s has a comma or colon, which overlay options cannot hold", p)
		}
	}
	switch {
	case want == generator.ChangesetCopy:
		return changeset.ModeCopy, why, nil
	case want == generator.ChangesetOverlay && !capable:
		return "", why, withHint(fmt.Errorf("%s=overlay, but the engine cannot mount an overlay here: %s", EnvMode, why),
			"unset "+EnvMode+" (or set it to copy) to copy the directories into the sandbox instead")
	case capable:
		return changeset.ModeOverlay, "", nil
	}
	return changeset.ModeCopy, why, nil
}

// sameMounts tells why a changeset's mounts differ from the profile's, if
// they do.
func sameMounts(cs *changeset.Changeset, mounts []generator.ChangesetMount) error {
	var have, want []string
	for _, m := range cs.Mounts {
		have = append(have, fmt.Sprintf("%s (%s at %s)", m.Name, m.Source, m.Target))
	}
	for _, m := range mounts {
		want = append(want, fmt.Sprintf("%s (%s at %s)", m.Name, m.Source, m.Target))
	}
	if slices.Equal(have, want) {
		return nil
	}
	return fmt.Errorf("it holds %s; the profile here has %s", strings.Join(have, ", "), strings.Join(want, ", "))
}

// Adjust puts the changeset in the host facts the project is generated
// from. A nil l leaves them as they are.
func (l *Changeset) Adjust(h *generator.Host) {
	if l != nil {
		h.Changeset = l.gen
	}
}

// VolumeCopies are the copies into and out of the sandbox (copy mode); none
// for a nil l.
func (l *Changeset) VolumeCopies() []VolumeCopy {
	if l == nil {
		return nil
	}
	return l.copies
}

// Wrote reports whether the sandbox of a new overlay changeset wrote to it
// although its run ended in an error (a copy's writes are lost with its
// volume; a resumed changeset is sealed again anyway).
func (l *Changeset) Wrote() bool {
	if l.cs.Mode != changeset.ModeOverlay || l.resumed {
		return false
	}
	for _, m := range l.cs.Mounts {
		if entries, err := os.ReadDir(l.cs.UpperDir(m.Name)); err == nil && len(entries) > 0 {
			return true
		}
	}
	return false
}

// Abandon undoes Prepare for a sandbox that did not run: a new changeset
// is removed; a resumed one is sealed again, as it was. A nil l has
// nothing to undo.
func (l *Changeset) Abandon() error {
	if l == nil {
		return nil
	}
	if l.resumed {
		if l.cs.Mode == changeset.ModeCopy && !l.sealed {
			return nil // no tree to seal: it stays as the killed run left it
		}
		return l.cs.Seal()
	}
	return os.RemoveAll(l.cs.Dir())
}

// Finish seals the changeset after the sandbox ran and writes to w what it
// holds and what comes next; one that holds no change is removed, and w
// told so in one line. When what the sandbox wrote could not be
// copied back (copyFailed), it is lost: a new changeset is removed, a
// resumed one stays as it was.
func (l *Changeset) Finish(w io.Writer, copyFailed bool) error {
	if copyFailed {
		if err := l.Abandon(); err != nil {
			return err
		}
		what := "removed"
		if l.resumed {
			what = "left as it was before this run"
		}
		return fmt.Errorf("what the sandbox wrote is lost; changeset %s is %s", l.cs.ID, what)
	}
	if l.cs.Mode == changeset.ModeCopy {
		for _, m := range l.cs.Mounts {
			if err := settleRacyMtimes(l.cs.TreeDir(m.Name), m.Source, l.cs.Created); err != nil {
				return fmt.Errorf("reading changeset %s: %w", l.cs.ID, err)
			}
		}
	}
	if err := l.cs.Seal(); err != nil {
		return withHint(err, "the changeset is kept in "+l.cs.Dir()+"; `"+command+" discard --force "+l.cs.ID+"` removes it")
	}
	n := -1
	if changes, err := l.cs.Changes(); err == nil {
		n = len(changes)
	}
	if n == 0 {
		// Nothing to review: a changeset kept would only hide the one
		// with changes from diff and apply.
		if err := l.cs.Discard(true); err != nil {
			return err
		}
		if l.resumed {
			fmt.Fprintf(w, "%s: changeset %s holds no change now; removed\n", command, l.cs.ID)
		} else {
			fmt.Fprintf(w, "%s: the sandbox changed nothing; no changeset kept\n", command)
		}
		return nil
	}
	what := "changes"
	switch {
	case n == 1:
		what = "1 change"
	case n >= 0:
		what = fmt.Sprintf("%d changes", n)
	}
	verb := "made"
	if l.resumed {
		verb = "continued"
	}
	id := l.cs.ID
	fmt.Fprintf(w, "%s: changeset %s %s (%s, %s); the originals are untouched\n", command, id, verb, what, l.cs.Mode)
	fmt.Fprintf(w, "%s:   review:  %s diff %s   (--stat, --json)\n", command, command, id)
	fmt.Fprintf(w, "%s:   apply:   %s apply %s [PATH...]\n", command, command, id)
	fmt.Fprintf(w, "%s:   discard: %s discard %s\n", command, command, id)
	fmt.Fprintf(w, "%s:   resume:  %s run --changeset --resume %s\n", command, command, id)
	return nil
}

// Reattach takes the changeset id that a persistent sandbox, made
// already, writes to (its overlay, or its volumes, hold what it wrote), to
// be finished when the sandbox is removed: nothing is made or realised
// again.
func Reattach(id string) (*Changeset, error) {
	store, err := changeset.DefaultStore()
	if err != nil {
		return nil, err
	}
	cs, err := store.Get(id)
	if err != nil {
		return nil, err
	}
	return &Changeset{cs: cs}, nil
}
