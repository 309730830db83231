package sandbox

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/changeset"
	cslaunch "github.com/propio/propio-sandbox/internal/changeset/launch"
)

// writes are a sandbox's copies with write access: the changeset that
// records each one's host path as it was when copied (a mount of it by
// copy, named "request-NAME"), and whether the copies came back into it.
type writes struct {
	cs     *changeset.Changeset
	ended  bool // copied back (or could not be): no more writable copies
	copied bool
}

// writeMount is the changeset's mount of a writable copy NAME.
func writeMount(name, source string) changeset.Mount {
	return changeset.Mount{Name: "request-" + name, Source: source, Target: path.Join(generator.WritesTarget, name)}
}

// checkWrite refuses what a writable copy cannot be: its source must be a
// directory all of which is copied, so that what the agent leaves there
// is the directory's new content.
func (m *Mounts) checkWrite(pl mountPlan) error {
	if !pl.write {
		return nil
	}
	if st, err := os.Stat(pl.source); err != nil || !st.IsDir() {
		return refused("%s is not a directory: write access is given to a directory (ask for the one holding it)", pl.source)
	}
	if len(pl.skip) > 0 {
		return refused("%s holds files workspace.hide leaves out: write access is not given to it (ask for read access)", pl.source)
	}
	return nil
}

// handleWrite copies a source into the writes volume, its base recorded
// first in the run's changeset of writable copies, made at the first.
func (m *Mounts) handleWrite(ctx context.Context, pl mountPlan, budget int64) (map[string]any, error) {
	if m.w.ended {
		return nil, refused("the sandbox has ended")
	}
	mo := writeMount(pl.name, pl.source)
	if m.w.cs != nil {
		if _, ok := m.w.cs.Mount(mo.Name); ok {
			return nil, refused("%s/%s is writable already: write there", generator.WritesTarget, pl.name)
		}
	}
	var err error
	if m.w.cs == nil {
		m.w.cs, err = m.c.Changesets.Create(m.c.Workspace, m.c.Profile, changeset.ModeCopy, []changeset.Mount{mo})
	} else {
		err = m.w.cs.AddMount(mo)
	}
	if err != nil {
		return nil, err
	}
	copied, err := m.c.Runtime.CopyEntry(ctx, m.c.Writes, backend.Entry{Name: pl.name, From: pl.source, Max: budget})
	if err != nil {
		delete(m.sizes, "w/"+pl.name)
		return nil, dropWrite(m.w.cs, mo.Name, err)
	}
	m.sizes["w/"+pl.name] = copied.Bytes
	return map[string]any{
		"path": path.Join(generator.WritesTarget, pl.name), "bytes": copied.Bytes, "files": copied.Files, "write": true,
		"changeset": m.w.cs.ID,
	}, nil
}

// dropWrite takes a copy that failed out of the changeset.
func dropWrite(cs *changeset.Changeset, mount string, err error) error {
	if derr := cs.DropMount(mount); derr != nil {
		return fmt.Errorf("%w (and %v)", err, derr)
	}
	return err
}

// CopyBack copies the writable copies, as the agent left them, into their
// changeset: once the sandbox's command has ended, before its volumes are
// removed. Later write requests are refused.
func (m *Mounts) CopyBack(ctx context.Context) error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.w.ended = true
	cs := m.w.cs
	if cs == nil || len(cs.Mounts) == 0 {
		return nil
	}
	tmp := filepath.Join(cs.Dir(), "copied")
	defer os.RemoveAll(tmp)
	if err := m.c.Runtime.CopyOut(ctx, m.c.Writes, tmp); err != nil {
		return fmt.Errorf("%w: %w", ErrCopyOut, err)
	}
	for _, mo := range cs.Mounts {
		tree := cs.TreeDir(mo.Name)
		if err := os.RemoveAll(tree); err != nil {
			return err
		}
		err := os.Rename(filepath.Join(tmp, path.Base(mo.Target)), tree)
		if os.IsNotExist(err) {
			err = os.Mkdir(tree, 0o700) // the agent removed it all
		}
		if err != nil {
			return err
		}
	}
	m.w.copied = true
	return nil
}

// FinishWrites seals the changeset of the writable copies and says in
// one line how to review it; one that holds no change is removed. Copies
// that did not come back are lost: their changeset is removed.
func (m *Mounts) FinishWrites(r Reporter) error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.w.ended = true
	cs := m.w.cs
	if cs == nil {
		return nil
	}
	if !m.w.copied || len(cs.Mounts) == 0 {
		if err := os.RemoveAll(cs.Dir()); err != nil {
			return err
		}
		if len(cs.Mounts) > 0 {
			return fmt.Errorf("what the agent wrote to its writable copies is lost: they were not copied back")
		}
		return nil
	}
	if err := cslaunch.SettleCopied(cs, cs.Created); err != nil {
		return err
	}
	if err := cs.Seal(); err != nil {
		return fmt.Errorf("%w; the changeset is kept in %s", err, cs.Dir())
	}
	changes, err := cs.Changes()
	if err != nil {
		return err
	}
	if len(changes) == 0 {
		return cs.Discard(true)
	}
	r.Note(fmt.Sprintf("changeset %s holds what the agent wrote to %s (%d change(s)); the host path is untouched: review with `propio-sandbox diff %s`, apply with `propio-sandbox apply %s`",
		cs.ID, sourcesOf(cs), len(changes), cs.ID, cs.ID))
	return nil
}

func sourcesOf(cs *changeset.Changeset) string {
	out := ""
	for i, mo := range cs.Mounts {
		if i > 0 {
			out += ", "
		}
		out += mo.Source
	}
	return out
}

// copyBackWrites is the launch's CopyBack of m, in its own time: not the
// run's context, which a signal that stopped the sandbox has ended.
func copyBackWrites(m *Mounts) error {
	ctx, cancel := context.WithTimeout(context.Background(), copyBudget)
	defer cancel()
	return m.CopyBack(ctx)
}
