// Package changeset keeps what a sandbox in changeset mode wrote, away from
// the original files, until the user has reviewed it: the store of
// changesets, the base manifest taken when a run starts, sealing (turning an
// overlay upper directory or a copied tree into a list of changes), diffs
// and apply.
//
// It never prints and never talks to a container engine: the engine mounts
// the overlay (or copies the tree in and out), the CLI shows what this
// package returns.
package changeset

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/propio/propio-sandbox/internal/fsutil"
)

// Mode is how the sandbox's writes are kept apart from the original.
type Mode string

const (
	// ModeOverlay: the engine mounts an overlay, lower = the original,
	// upper = UpperDir; the changes are what the upper directory holds.
	ModeOverlay Mode = "overlay"
	// ModeCopy: the sandbox works on a copy of the original; after the run
	// the copy's final content is extracted into TreeDir and compared with
	// the original.
	ModeCopy Mode = "copy"
)

// State is where a changeset is in its life.
type State string

const (
	StateRunning State = "running" // a sandbox is using it
	StateReady   State = "ready"   // sealed, can be reviewed/applied
	StatePartial State = "partial" // some paths applied
)

// Mount is one directory of the host whose changes a changeset holds.
type Mount struct {
	Name   string `json:"name"`   // "workspace" for the workspace, "mount-<i>" for mounts[i]: a directory name
	Source string `json:"source"` // the original directory on the host (absolute, symlinks resolved)
	Target string `json:"target"` // where the sandbox sees it
}

// WorkspaceMount is the name of the workspace's mount.
const WorkspaceMount = "workspace"

// Changeset is one sandbox run's (or several resumed runs') changes, kept
// in its own directory of the store until applied or discarded.
type Changeset struct {
	ID        string    `json:"id"`
	Workspace string    `json:"workspace"`
	Profile   string    `json:"profile"`
	Created   time.Time `json:"created"`
	Mode      Mode      `json:"mode"`
	State     State     `json:"state"`
	Mounts    []Mount   `json:"mounts"`

	dir string
}

// Sentinel errors of the store.
var (
	ErrNotFound  = errors.New("no such changeset")
	ErrAmbiguous = errors.New("changeset id prefix is ambiguous")
)

// Store is the directory holding one subdirectory per changeset.
type Store struct{ Dir string }

// DefaultStore is $XDG_STATE_HOME/propio-sandbox/changesets, with
// XDG_STATE_HOME defaulting to ~/.local/state (as for the other state of
// propio-sandbox).
func DefaultStore() (Store, error) {
	state := os.Getenv("XDG_STATE_HOME")
	if !filepath.IsAbs(state) {
		home, err := os.UserHomeDir()
		if err != nil {
			return Store{}, fmt.Errorf("finding the changeset store: %w", err)
		}
		state = filepath.Join(home, ".local", "state")
	}
	return Store{Dir: filepath.Join(state, "propio-sandbox", "changesets")}, nil
}

const (
	metaFile    = "meta.json"
	changesFile = "changes.json"
	appliedFile = "applied.log"
	baseFile    = "base.manifest"
)

// newID makes a short id that sorts by creation time: 20261122-064500-3f9a.
func newID(now time.Time) (string, error) {
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return now.UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b[:]), nil
}

// Create makes a new changeset for a run: its directories (0700), the base
// manifest of every mount's Source (a stat of every entry, no content
// read), and meta.json with State running.
func (s Store) Create(workspace, profile string, mode Mode, mounts []Mount) (*Changeset, error) {
	if mode != ModeOverlay && mode != ModeCopy {
		return nil, fmt.Errorf("creating a changeset: unknown mode %q", mode)
	}
	if len(mounts) == 0 {
		return nil, errors.New("creating a changeset: no mounts")
	}
	seen := map[string]bool{}
	for _, m := range mounts {
		if m.Name == "" || m.Name == "." || m.Name == ".." || strings.ContainsAny(m.Name, `/\:`) || strings.HasPrefix(m.Name, ".") {
			return nil, fmt.Errorf("creating a changeset: mount name %q cannot be a directory name", m.Name)
		}
		if seen[m.Name] {
			return nil, fmt.Errorf("creating a changeset: mount name %q twice", m.Name)
		}
		seen[m.Name] = true
		if !filepath.IsAbs(m.Source) {
			return nil, fmt.Errorf("creating a changeset: mount %s: source %q is not absolute", m.Name, m.Source)
		}
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the changeset store: %w", err)
	}
	now := time.Now()
	var c *Changeset
	for range 10 {
		id, err := newID(now)
		if err != nil {
			return nil, fmt.Errorf("creating a changeset id: %w", err)
		}
		dir := filepath.Join(s.Dir, id)
		if err := os.Mkdir(dir, 0o700); errors.Is(err, fs.ErrExist) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("creating changeset %s: %w", id, err)
		}
		c = &Changeset{ID: id, Workspace: workspace, Profile: profile, Created: now.UTC(), Mode: mode, State: StateRunning, Mounts: mounts, dir: dir}
		break
	}
	if c == nil {
		return nil, errors.New("creating a changeset: no free id")
	}
	fail := func(err error) (*Changeset, error) {
		os.RemoveAll(c.dir)
		return nil, err
	}
	for _, m := range mounts {
		if err := c.makeMount(m); err != nil {
			return fail(err)
		}
	}
	if err := c.save(); err != nil {
		return fail(err)
	}
	return c, nil
}

// makeMount makes the directories of mount m and records its base.
func (c *Changeset) makeMount(m Mount) error {
	md := filepath.Join(c.dir, m.Name)
	dirs := []string{md}
	if c.Mode == ModeOverlay {
		dirs = append(dirs, c.UpperDir(m.Name), c.WorkDir(m.Name))
	} else {
		dirs = append(dirs, c.TreeDir(m.Name))
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("creating changeset %s: %w", c.ID, err)
		}
	}
	man, err := scanManifest(m.Source)
	if err != nil {
		return fmt.Errorf("creating changeset %s: recording the base of %s: %w", c.ID, m.Source, err)
	}
	if err := writeManifest(filepath.Join(md, baseFile), man); err != nil {
		return fmt.Errorf("creating changeset %s: %w", c.ID, err)
	}
	return nil
}

// AddMount adds mount m to a running changeset, its base recorded now (a
// host path the sandbox was given to write to while it ran).
func (c *Changeset) AddMount(m Mount) error {
	if c.State != StateRunning {
		return fmt.Errorf("changeset %s is not running", c.ID)
	}
	if _, ok := c.Mount(m.Name); ok || m.Name == "" || strings.ContainsAny(m.Name, `/\:`) || strings.HasPrefix(m.Name, ".") {
		return fmt.Errorf("changeset %s: mount name %q is taken or cannot be a directory name", c.ID, m.Name)
	}
	if !filepath.IsAbs(m.Source) {
		return fmt.Errorf("changeset %s: mount %s: source %q is not absolute", c.ID, m.Name, m.Source)
	}
	if err := c.makeMount(m); err != nil {
		os.RemoveAll(filepath.Join(c.dir, m.Name))
		return err
	}
	c.Mounts = append(c.Mounts, m)
	return c.save()
}

// DropMount takes mount name out of a running changeset, with what it
// recorded (a host path whose copy into the sandbox failed).
func (c *Changeset) DropMount(name string) error {
	i := slices.IndexFunc(c.Mounts, func(m Mount) bool { return m.Name == name })
	if c.State != StateRunning || i < 0 {
		return fmt.Errorf("changeset %s: no mount %q to drop", c.ID, name)
	}
	if err := os.RemoveAll(filepath.Join(c.dir, name)); err != nil {
		return err
	}
	c.Mounts = slices.Delete(c.Mounts, i, i+1)
	return c.save()
}

// save writes meta.json atomically.
func (c *Changeset) save() error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(c.dir, metaFile), append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("saving changeset %s: %w", c.ID, err)
	}
	return nil
}

func (s Store) load(id string) (*Changeset, error) {
	dir := filepath.Join(s.Dir, id)
	data, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return nil, fmt.Errorf("reading changeset %s: %w", id, err)
	}
	var c Changeset
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("reading changeset %s: %w", id, err)
	}
	if c.ID != id {
		return nil, fmt.Errorf("reading changeset %s: meta.json names %q", id, c.ID)
	}
	c.dir = dir
	return &c, nil
}

// ids lists the store's changeset directories, sorted (= oldest first).
func (s Store) ids() ([]string, error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing changesets: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			if _, err := os.Stat(filepath.Join(s.Dir, e.Name(), metaFile)); err == nil {
				ids = append(ids, e.Name())
			}
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Get returns the changeset whose id is idOrPrefix or the only one that
// starts with it: ErrNotFound when none does, ErrAmbiguous when several do.
func (s Store) Get(idOrPrefix string) (*Changeset, error) {
	if idOrPrefix == "" || strings.ContainsAny(idOrPrefix, `/\`) {
		return nil, fmt.Errorf("changeset %q: %w", idOrPrefix, ErrNotFound)
	}
	ids, err := s.ids()
	if err != nil {
		return nil, err
	}
	var match []string
	for _, id := range ids {
		if id == idOrPrefix {
			return s.load(id)
		}
		if strings.HasPrefix(id, idOrPrefix) {
			match = append(match, id)
		}
	}
	switch len(match) {
	case 0:
		return nil, fmt.Errorf("changeset %q: %w", idOrPrefix, ErrNotFound)
	case 1:
		return s.load(match[0])
	}
	return nil, fmt.Errorf("%q matches %s: %w", idOrPrefix, strings.Join(match, ", "), ErrAmbiguous)
}

// List returns every changeset of the store, oldest first. A directory
// whose meta.json cannot be read is left out.
func (s Store) List() ([]*Changeset, error) {
	ids, err := s.ids()
	if err != nil {
		return nil, err
	}
	var list []*Changeset
	for _, id := range ids {
		if c, err := s.load(id); err == nil {
			list = append(list, c)
		}
	}
	sort.SliceStable(list, func(i, j int) bool {
		if !list[i].Created.Equal(list[j].Created) {
			return list[i].Created.Before(list[j].Created)
		}
		return list[i].ID < list[j].ID
	})
	return list, nil
}

// Latest returns the newest changeset of workspace that is not Empty, or
// ErrNotFound.
func (s Store) Latest(workspace string) (*Changeset, error) {
	list, err := s.List()
	if err != nil {
		return nil, err
	}
	for i := len(list) - 1; i >= 0; i-- {
		if list[i].Workspace == workspace && !list[i].Empty() {
			return list[i], nil
		}
	}
	return nil, fmt.Errorf("no changeset for %s: %w", workspace, ErrNotFound)
}

// Empty reports whether the changeset is sealed and holds no change left to
// apply: nothing to review. One whose changes cannot be read is not empty
// (reading it says what is wrong).
func (c *Changeset) Empty() bool {
	if c.State == StateRunning {
		return false
	}
	changes, err := c.Changes()
	return err == nil && len(changes) == 0
}

// Dir is the changeset's directory in the store.
func (c *Changeset) Dir() string { return c.dir }

// UpperDir is the overlay upper directory of a mount (overlay mode).
func (c *Changeset) UpperDir(mount string) string { return filepath.Join(c.dir, mount, "upper") }

// WorkDir is the overlay work directory of a mount (overlay mode).
func (c *Changeset) WorkDir(mount string) string { return filepath.Join(c.dir, mount, "work") }

// TreeDir is where the sandbox's final copy of a mount is extracted after
// the run (copy mode).
func (c *Changeset) TreeDir(mount string) string { return filepath.Join(c.dir, mount, "tree") }

// Mount returns the mount of that name.
func (c *Changeset) Mount(name string) (Mount, bool) {
	for _, m := range c.Mounts {
		if m.Name == name {
			return m, true
		}
	}
	return Mount{}, false
}

// Resume makes the changeset running again, for another run on top of what
// it holds (run --resume): the upper directories or trees are kept.
func (c *Changeset) Resume() error {
	c.State = StateRunning
	return c.save()
}
