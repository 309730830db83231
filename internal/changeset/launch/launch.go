package cli

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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/changeset"
	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
)

// envChangesetMode forces how a changeset is realised: overlay, copy or auto
// (the default: an overlay where the engine can mount one of this host's
// directories, else a copy).
const envChangesetMode = "PROPIO_SANDBOX_CHANGESET_MODE"

// launchChangeset is the changeset one run writes to.
type launchChangeset struct {
	cs      *changeset.Changeset
	resumed bool
	sealed  bool // resumed, and sealed before: a copy's tree holds the last result
	gen     *generator.Changeset
	copies  []engine.VolumeCopy
}

// changesetMode reads PROPIO_SANDBOX_CHANGESET_MODE.
func changesetMode() (string, error) {
	v := strings.TrimSpace(os.Getenv(envChangesetMode))
	switch v {
	case "", "auto":
		return "auto", nil
	case generator.ChangesetOverlay, generator.ChangesetCopy:
		return v, nil
	}
	return "", withHint(usageError{fmt.Errorf("%s=%q: want overlay, copy or auto", envChangesetMode, v)}, "unset it to let "+name+" choose")
}

// changesetMounts lists the directories of p in changeset mode, with their
// sources resolved; a source that is not a directory is a positioned error.
func changesetMounts(p *profile.Profile, workspace string) ([]generator.ChangesetMount, error) {
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

// prepareChangeset creates the run's changeset (or resumes the one named)
// and chooses its realisation: an overlay where the engine can mount one of
// this host's directories, else a copy, unless PROPIO_SANDBOX_CHANGESET_MODE
// says which. Nothing is left behind when it fails.
func (a *app) prepareChangeset(ctx context.Context, eng *engine.Engine, e env, p *profile.Profile, resume string) (*launchChangeset, error) {
	want, err := changesetMode()
	if err != nil {
		return nil, err
	}
	mounts, err := changesetMounts(p, e.workspace)
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
	if p.Workspace.Mode == profile.ModeChangeset {
		// As for the profile's mounts (Check): a mount point inside would
		// show up in the changeset.
		extra, err := hostinfo.ExtraMounts(os.LookupEnv)
		if err != nil {
			return nil, err // generate has said it already, with a hint
		}
		ws := filepath.Clean(p.Workspace.Target)
		for _, m := range extra {
			if m.Target != ws && fsutil.Within(ws, m.Target) {
				return nil, withHint(fmt.Errorf("%s mounts %s inside the workspace (%s), whose mode is changeset: its mount point would become part of the changeset", hostinfo.EnvMounts, m.Target, ws),
					"mount it outside "+ws+", or run without --changeset")
			}
		}
	}
	for _, m := range mounts {
		if fsutil.Within(m.Source, store.Dir) || fsutil.Within(store.Dir, m.Source) {
			return nil, withHint(fmt.Errorf("%s and the changeset store %s are one inside the other: a changeset of it would hold itself", m.Source, store.Dir),
				"keep XDG_STATE_HOME outside the directories in changeset mode")
		}
	}
	ov, err := eng.OverlayCapable(ctx)
	if err != nil {
		return nil, err
	}
	capable, why := ov.OK, ov.Why
	// Every path an overlay's options would hold.
	paths := []string{store.Dir}
	for _, m := range mounts {
		paths = append(paths, m.Source)
	}
	mode, why, err := chooseMode(want, capable, why, paths)
	if err != nil {
		return nil, err
	}

	l := &launchChangeset{}
	if resume != "" {
		cs, err := store.Get(resume)
		switch {
		case errors.Is(err, changeset.ErrNotFound):
			return nil, withHint(err, "run `"+name+" changes` to list the changesets there are")
		case errors.Is(err, changeset.ErrAmbiguous):
			return nil, withHint(err, "give more of the id (`"+name+" changes` lists them)")
		case err != nil:
			return nil, err
		}
		if err := sameMounts(cs, mounts); err != nil {
			return nil, withHint(fmt.Errorf("changeset %s cannot be resumed with this profile: %w", cs.ID, err),
				"resume it with the profile it was made with ("+cs.Profile+"), from "+cs.Workspace)
		}
		switch {
		case want != "auto" && string(cs.Mode) != want:
			return nil, fmt.Errorf("changeset %s is realised as %s, and %s=%s", cs.ID, cs.Mode, envChangesetMode, want)
		case cs.Mode == changeset.ModeOverlay && !capable:
			return nil, withHint(fmt.Errorf("changeset %s is an overlay, and the engine cannot mount one here: %s", cs.ID, why),
				"resume it where it was made, with an engine on this host")
		}
		// A copy's tree is what the last run that finished left; a
		// changeset never sealed has none yet, and starts from the sources.
		_, err = os.Stat(filepath.Join(cs.Dir(), "changes.json"))
		l.sealed = err == nil
		if cs.State == changeset.StateRunning && cs.Mode == changeset.ModeCopy {
			fmt.Fprintf(a.stderr, "%s: warning: the last run of changeset %s did not finish (its launcher was killed); what it did in its copy is lost, the changeset goes on from the run before\n", name, cs.ID)
		}
		err = eng.ReleaseChangeset(ctx, cs.ID)
		if errors.Is(err, engine.ErrChangesetInUse) {
			return nil, withHint(err, "wait for that sandbox to end, or stop it (`"+name+" ls` lists the sandboxes)")
		}
		if err != nil {
			return nil, err
		}
		if err := cs.Resume(); err != nil {
			return nil, err
		}
		l.cs, l.resumed = cs, true
	} else {
		var ms []changeset.Mount
		for _, m := range mounts {
			ms = append(ms, changeset.Mount{Name: m.Name, Source: m.Source, Target: m.Target})
		}
		cs, err := store.Create(e.workspace, p.Meta.File, mode, ms)
		if err != nil {
			return nil, err
		}
		l.cs = cs
	}

	cs := l.cs
	l.gen = &generator.Changeset{ID: cs.ID, Mode: string(cs.Mode), UserXattr: ov.UserXattr}
	for _, m := range mounts {
		switch cs.Mode {
		case changeset.ModeOverlay:
			m.UpperDir, m.WorkDir = cs.UpperDir(m.Name), cs.WorkDir(m.Name)
			// The root of an overlay takes its owner and mode from the upper
			// directory's: the original's.
			if err := likeRoot(m.UpperDir, m.Source); err != nil {
				l.abandon()
				return nil, err
			}
		case changeset.ModeCopy:
			from := m.Source
			if l.sealed {
				from = cs.TreeDir(m.Name) // what the last run left
			}
			l.copies = append(l.copies, engine.VolumeCopy{Volume: "changeset-" + m.Name, From: from, To: cs.TreeDir(m.Name)})
		}
		l.gen.Mounts = append(l.gen.Mounts, m)
	}
	return l, nil
}

// chooseMode picks a new changeset's realisation: what want (overlay, copy
// or auto) asks, an overlay when auto and the engine can mount one of these
// paths, else a copy. It returns why an overlay cannot be, if it cannot.
func chooseMode(want string, capable bool, why string, paths []string) (changeset.Mode, string, error) {
	for _, p := range paths {
		if capable && strings.ContainsAny(p, ",:") {
			capable, why = false, fmt.Sprintf("%s has a comma or colon, which overlay options cannot hold", p)
		}
	}
	switch {
	case want == generator.ChangesetCopy:
		return changeset.ModeCopy, why, nil
	case want == generator.ChangesetOverlay && !capable:
		return "", why, withHint(fmt.Errorf("%s=overlay, but the engine cannot mount an overlay here: %s", envChangesetMode, why),
			"unset "+envChangesetMode+" (or set it to copy) to copy the directories into the sandbox instead")
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

// likeRoot gives dir the owner (as root) and mode of the directory src.
func likeRoot(dir, src string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		if uid, gid, ok := owner(st); ok {
			if err := os.Lchown(dir, uid, gid); err != nil {
				return err
			}
		}
	}
	return os.Chmod(dir, st.Mode()&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky))
}

// adjust puts the changeset in the host facts the project is generated from.
func (l *launchChangeset) adjust(h *generator.Host) {
	if l != nil {
		h.Changeset = l.gen
	}
}

// wrote reports whether the sandbox of a new overlay changeset wrote to it
// although its run ended in an error (a copy's writes are lost with its
// volume; a resumed changeset is sealed again anyway).
func (l *launchChangeset) wrote() bool {
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

// abandon undoes prepareChangeset for a sandbox that did not run: a new
// changeset is removed; a resumed one is sealed again, as it was.
func (l *launchChangeset) abandon() error {
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

// finish seals the changeset after the sandbox ran and says what comes next.
// When what the sandbox wrote could not be copied back (copyFailed), it is
// lost: a new changeset is removed, a resumed one stays as it was.
func (l *launchChangeset) finish(w io.Writer, copyFailed bool) error {
	if copyFailed {
		if err := l.abandon(); err != nil {
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
		return withHint(err, "the changeset is kept in "+l.cs.Dir()+"; `"+name+" discard --force "+l.cs.ID+"` removes it")
	}
	n := -1
	if changes, err := l.cs.Changes(); err == nil {
		n = len(changes)
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
	fmt.Fprintf(w, "%s: changeset %s %s (%s, %s); the originals are untouched\n", name, id, verb, what, l.cs.Mode)
	fmt.Fprintf(w, "%s:   review:  %s diff %s   (--stat, --json)\n", name, name, id)
	fmt.Fprintf(w, "%s:   apply:   %s apply %s [PATH...]\n", name, name, id)
	fmt.Fprintf(w, "%s:   discard: %s discard %s\n", name, name, id)
	fmt.Fprintf(w, "%s:   resume:  %s run --changeset --resume %s\n", name, name, id)
	return nil
}

func owner(st fs.FileInfo) (uid, gid int, ok bool) {
	s, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return int(s.Uid), int(s.Gid), true
}

// volumeCopies are the copies into and out of the sandbox (copy mode).
func (l *launchChangeset) volumeCopies() []engine.VolumeCopy {
	if l == nil {
		return nil
	}
	return l.copies
}

// settleRacyMtimes works around the engine's archive API, which gives the
// copied tree's mtimes to the second only: a file the agent rewrote with
// the same size in the same second as its original's mtime would look
// unchanged. For each file of tree whose whole-second mtime, size and mode
// equal the original's, and whose original was written at or after since
// (a second's margin), the contents are compared: equal, the file gets the
// original's exact mtime; different, an mtime a nanosecond off, so that
// Seal reads it. Older originals cannot have been rewritten in their own
// second during the run.
func settleRacyMtimes(tree, source string, since time.Time) error {
	limit := since.Add(-time.Second).Unix()
	return filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		ti, err := d.Info()
		if err != nil {
			return err
		}
		if ti.ModTime().Nanosecond() != 0 {
			return nil
		}
		rel, _ := filepath.Rel(tree, p)
		orig := filepath.Join(source, rel)
		si, err := os.Lstat(orig)
		if err != nil || !si.Mode().IsRegular() || si.Size() != ti.Size() || si.Mode().Perm() != ti.Mode().Perm() ||
			si.ModTime().Unix() != ti.ModTime().Unix() || si.ModTime().Unix() < limit {
			return nil
		}
		same, err := sameContent(p, orig)
		if err != nil {
			return err
		}
		mtime := si.ModTime()
		if !same {
			mtime = ti.ModTime().Add(time.Nanosecond)
		}
		return os.Chtimes(p, mtime, mtime)
	})
}

func sameContent(a, b string) (bool, error) {
	x, err := os.ReadFile(a)
	if err != nil {
		return false, err
	}
	y, err := os.ReadFile(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(x, y), nil
}
