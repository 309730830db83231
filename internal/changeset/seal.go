package changeset

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/propio/propio-sandbox/internal/fsutil"
	"golang.org/x/sys/unix"
)

// Kind is what a change does to a path.
type Kind string

const (
	KindAdded    Kind = "added"    // the path did not exist
	KindModified Kind = "modified" // a file's content or a symlink's target changed (its mode may too)
	KindDeleted  Kind = "deleted"  // the path is gone
	KindMode     Kind = "mode"     // only the permission bits changed
	KindType     Kind = "type"     // file, directory and symlink replaced one another
)

// Side is a path as it was (Before: the original when the run started) or
// as the changeset leaves it (After). Type is empty for "no such path".
type Side struct {
	Type   Type        `json:"type,omitempty"`
	Mode   fs.FileMode `json:"mode,omitempty"` // permission and setuid/setgid/sticky bits
	Size   int64       `json:"size,omitempty"`
	Mtime  int64       `json:"mtime,omitempty"`  // Before only: the base manifest's, in ns
	SHA256 string      `json:"sha256,omitempty"` // files: the content's hash (Before: as the run started)
	Target string      `json:"target,omitempty"` // symlinks
}

// Change is one changed path of one mount.
type Change struct {
	Mount  string `json:"mount"`
	Path   string `json:"path"` // slash-separated, relative to the mount's root
	Kind   Kind   `json:"kind"`
	Before Side   `json:"before"`
	After  Side   `json:"after"`
	// BaseChanged: the original was already changed (by someone else than
	// the sandbox) when the changeset was sealed, so its content as the run
	// started is unknown; apply treats the path as a conflict unless it
	// already equals After.
	BaseChanged bool `json:"base_changed,omitempty"`
}

type changesDoc struct {
	Version int       `json:"version"`
	Sealed  time.Time `json:"sealed"`
	Changes []Change  `json:"changes"`
}

// Seal turns what the run left into changes.json and makes the changeset
// ready for review: in overlay mode from each mount's upper directory
// (whiteouts and opaque directories included), in copy mode by comparing
// each TreeDir with the base manifest and the original. It records, for
// every touched path, the content hash of the original as it was when the
// run started (hashed now when its stat still equals the base manifest's;
// otherwise the change is marked BaseChanged), so that apply can tell a
// conflict. Sealing again (after a resumed run) recomputes everything.
func (c *Changeset) Seal() error {
	var all []Change
	for _, m := range c.Mounts {
		base, err := readManifest(filepath.Join(c.dir, m.Name, baseFile))
		if err != nil {
			return fmt.Errorf("sealing changeset %s: %w", c.ID, err)
		}
		s := sealer{mount: m, base: base}
		switch c.Mode {
		case ModeOverlay:
			err = s.overlay(c.UpperDir(m.Name))
		case ModeCopy:
			err = s.copy(c.TreeDir(m.Name))
		default:
			err = fmt.Errorf("unknown mode %q", c.Mode)
		}
		if err != nil {
			return fmt.Errorf("sealing changeset %s: mount %s: %w", c.ID, m.Name, err)
		}
		all = append(all, s.changes...)
	}
	data, err := json.MarshalIndent(changesDoc{Version: 1, Sealed: time.Now().UTC(), Changes: nonNil(all)}, "", " ")
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(c.dir, changesFile), append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("sealing changeset %s: %w", c.ID, err)
	}
	// A new seal starts a new list: what an earlier apply did is in the
	// originals now, and Apply counts a path equal to its result as applied.
	if err := os.Remove(filepath.Join(c.dir, appliedFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("sealing changeset %s: %w", c.ID, err)
	}
	c.State = StateReady
	return c.save()
}

func nonNil(c []Change) []Change {
	if c == nil {
		return []Change{}
	}
	return c
}

// sealer computes the changes of one mount.
type sealer struct {
	mount   Mount
	base    manifest
	changes []Change
}

// isWhiteout: overlayfs marks a deleted lower entry with a character
// device 0:0 of the same name in the upper directory.
func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// isOpaque: a directory of the upper layer that hides everything of the
// lower directory of the same name (rm -r dir; mkdir dir).
func isOpaque(path string) bool {
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		buf := make([]byte, 8)
		n, err := unix.Lgetxattr(path, attr, buf)
		if err == nil && n == 1 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

// overlay reads the upper directory: every entry there is new or replaced,
// whiteouts are deletions, opaque directories delete the lower's children
// they do not hold themselves.
func (s *sealer) overlay(upper string) error {
	inUpper := map[string]bool{}
	var opaque []string
	var walk func(rel string) error
	walk = func(rel string) error {
		dir := filepath.Join(upper, filepath.FromSlash(rel))
		f, err := os.Open(dir)
		if err != nil {
			return fmt.Errorf("reading the upper directory: %w", err)
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return fmt.Errorf("reading the upper directory: %w", err)
		}
		sort.Strings(names)
		for _, name := range names {
			p := name
			if rel != "" {
				p = rel + "/" + name
			}
			full := filepath.Join(dir, name)
			var st unix.Stat_t
			if err := unix.Lstat(full, &st); err != nil {
				return fmt.Errorf("reading the upper directory: lstat %s: %w", full, err)
			}
			inUpper[p] = true
			be, inBase := s.base.find(p)
			if !inBase {
				be = Entry{Path: p}
			}
			if isWhiteout(&st) {
				if inBase {
					if err := s.deleted(be); err != nil {
						return err
					}
				}
				continue
			}
			ue, err := lstatEntry(full, p)
			if err != nil {
				return err
			}
			if ue.Type == TypeOther {
				continue // fifos, sockets, devices: not carried over
			}
			if err := s.compare(be, ue, full); err != nil {
				return err
			}
			if ue.Type == TypeDir {
				if inBase && be.Type == TypeDir && isOpaque(full) {
					opaque = append(opaque, p)
				}
				if err := walk(p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(""); err != nil {
		return err
	}
	for _, p := range opaque {
		for _, d := range s.base.under(p) {
			if !inUpper[d.Path] {
				if err := s.deleteOne(d); err != nil {
					return err
				}
			}
		}
	}
	s.sort()
	return nil
}

// copy compares the extracted tree with the base manifest: a merge of two
// sorted lists; content is read only where the stat differs.
func (s *sealer) copy(tree string) error {
	if _, err := os.Stat(tree); err != nil {
		return fmt.Errorf("reading the copied tree: %w", err)
	}
	got, err := scanManifest(tree)
	if err != nil {
		return fmt.Errorf("reading the copied tree: %w", err)
	}
	i, j := 0, 0
	for i < len(s.base) || j < len(got) {
		switch {
		case j == len(got) || i < len(s.base) && s.base[i].Path < got[j].Path:
			if err := s.deleteOne(s.base[i]); err != nil {
				return err
			}
			i++
		case i == len(s.base) || got[j].Path < s.base[i].Path:
			if got[j].Type != TypeOther {
				if err := s.compare(Entry{Path: got[j].Path}, got[j], filepath.Join(tree, filepath.FromSlash(got[j].Path))); err != nil {
					return err
				}
			}
			j++
		default:
			be, te := s.base[i], got[j]
			i++
			j++
			if te.Type == TypeOther || sameStat(be, te) || sameCopied(be, te) {
				continue
			}
			if err := s.compare(be, te, filepath.Join(tree, filepath.FromSlash(te.Path))); err != nil {
				return err
			}
		}
	}
	s.sort()
	return nil
}

// sameCopied: tar may keep mtimes to the second only.
func sameCopied(base, tree Entry) bool {
	return base.Type == tree.Type && base.Mode == tree.Mode && base.Size == tree.Size && base.Target == tree.Target &&
		tree.Mtime%1e9 == 0 && base.Mtime/1e9 == tree.Mtime/1e9
}

// sort orders the changes by path and drops repeats (a directory's
// children are deleted both as its children and as the lower's entries
// under an opaque directory or a type change).
func (s *sealer) sort() {
	sort.SliceStable(s.changes, func(i, j int) bool { return s.changes[i].Path < s.changes[j].Path })
	out := s.changes[:0]
	for i, ch := range s.changes {
		if i > 0 && ch.Path == s.changes[i-1].Path {
			continue
		}
		out = append(out, ch)
	}
	s.changes = out
}

// source is the original's path of p.
func (s *sealer) source(p string) string {
	return filepath.Join(s.mount.Source, filepath.FromSlash(p))
}

// before describes the original of be as the run started: the base
// manifest's stat, and the content's hash when the original still has that
// stat. ok is false when the original changed since.
func (s *sealer) before(be Entry) (side Side, ok bool, err error) {
	side = sideOf(be)
	side.Mtime = be.Mtime
	cur, err := lstatEntry(s.source(be.Path), be.Path)
	if err != nil {
		return side, false, err
	}
	if be.Type == TypeNone {
		return side, cur.Type == TypeNone, nil
	}
	if !sameStat(cur, be) {
		return side, false, nil
	}
	if be.Type == TypeFile {
		if side.SHA256, err = hashFile(s.source(be.Path)); err != nil {
			return side, false, err
		}
	}
	return side, true, nil
}

func sideOf(e Entry) Side {
	if e.Type == TypeNone {
		return Side{}
	}
	return Side{Type: e.Type, Mode: e.Mode, Size: e.Size, Target: e.Target}
}

// compare records the change from the base entry be (TypeNone: absent) to
// the result ue, whose content is at full; nothing when they are the same.
func (s *sealer) compare(be, ue Entry, full string) error {
	after := sideOf(ue)
	if ue.Type == TypeFile {
		h, err := hashFile(full)
		if err != nil {
			return err
		}
		after.SHA256 = h
	}
	before, ok, err := s.before(be)
	if err != nil {
		return err
	}
	ch := Change{Mount: s.mount.Name, Path: ue.Path, Before: before, After: after, BaseChanged: !ok}
	switch {
	case be.Type == TypeNone:
		ch.Kind = KindAdded
	case be.Type != ue.Type:
		ch.Kind = KindType
		if be.Type == TypeDir {
			// A directory replaced by a file or a symlink: all it held is gone.
			for _, d := range s.base.under(be.Path) {
				if err := s.deleteOne(d); err != nil {
					return err
				}
			}
		}
	case ue.Type == TypeFile:
		same := false
		if be.Size == ue.Size {
			if ok {
				same = before.SHA256 == after.SHA256
			} else if h, err := hashFile(s.source(be.Path)); err == nil {
				// The original changed during the run: compare with what it is now.
				same = h == after.SHA256
			}
		}
		switch {
		case !same:
			ch.Kind = KindModified
		case be.Mode != ue.Mode:
			ch.Kind = KindMode
		default:
			return nil // copied up or touched, not changed
		}
	case ue.Type == TypeSymlink:
		if be.Target == ue.Target {
			return nil
		}
		ch.Kind = KindModified
	default: // directories
		if be.Mode == ue.Mode {
			return nil
		}
		ch.Kind = KindMode
	}
	s.changes = append(s.changes, ch)
	return nil
}

// deleted records the deletion of be and, for a directory, of all it held.
func (s *sealer) deleted(be Entry) error {
	if err := s.deleteOne(be); err != nil {
		return err
	}
	if be.Type == TypeDir {
		for _, d := range s.base.under(be.Path) {
			if err := s.deleteOne(d); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *sealer) deleteOne(be Entry) error {
	if be.Type == TypeOther {
		return nil
	}
	before, ok, err := s.before(be)
	if err != nil {
		return err
	}
	s.changes = append(s.changes, Change{Mount: s.mount.Name, Path: be.Path, Kind: KindDeleted, Before: before, BaseChanged: !ok})
	return nil
}

// hashFile is the hex sha256 of a file's content.
func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
