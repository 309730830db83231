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
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrRunning: the changeset's sandbox is running; it cannot be discarded
// (without force) or applied.
var ErrRunning = errors.New("changeset is in use by a running sandbox")

type status int

const (
	statusPending  status = iota // the original is as the run found it: apply may change it
	statusApplied                // the original already is the changeset's result
	statusConflict               // the original changed since the run started, to something else
)

// status compares the original of ch as it is now with its base (as the
// run started) and with the changeset's result.
func (c *Changeset) status(ch Change) (status, error) {
	src := c.source(ch.Mount, ch.Path)
	cur, err := lstatEntry(src, ch.Path)
	if err != nil {
		return 0, err
	}
	var curHash string
	hash := func() string {
		if curHash == "" && cur.Type == TypeFile {
			curHash, _ = hashFile(src)
		}
		return curHash
	}
	b := ch.Before
	if !ch.BaseChanged && cur.Type == b.Type {
		switch b.Type {
		case TypeNone, TypeDir:
			return statusPending, nil
		case TypeSymlink:
			if cur.Target == b.Target {
				return statusPending, nil
			}
		case TypeFile:
			if cur.Size == b.Size && cur.Mtime == b.Mtime && cur.Mode == b.Mode {
				return statusPending, nil // same stat: same content, as git assumes
			}
			if b.SHA256 != "" && cur.Size == b.Size && hash() == b.SHA256 {
				return statusPending, nil
			}
		}
	}
	a := ch.After
	if cur.Type == a.Type {
		switch a.Type {
		case TypeNone:
			return statusApplied, nil
		case TypeDir:
			if cur.Mode == a.Mode {
				return statusApplied, nil
			}
		case TypeSymlink:
			if cur.Target == a.Target {
				return statusApplied, nil
			}
		case TypeFile:
			if cur.Mode == applyMode(a) && cur.Size == a.Size && hash() == a.SHA256 {
				return statusApplied, nil
			}
		}
	}
	return statusConflict, nil
}

// ApplyOptions change how Apply works.
type ApplyOptions struct {
	// Force applies conflicting paths too, overwriting what changed in the
	// original since the run started.
	Force bool
	// Pause sleeps this long after each applied path. Test-only: the CLI
	// sets it from PROPIO_SANDBOX_APPLY_PAUSE so that an end-to-end test
	// can kill apply halfway; never set it otherwise.
	Pause time.Duration
}

// Conflict is a path apply left alone.
type Conflict struct {
	Change
	Display string
	Reason  string
}

// ApplyResult says what Apply did.
type ApplyResult struct {
	Applied   []Change   // paths written, deleted or chmod'ed now, or found already applied
	Conflicts []Conflict // paths left alone
	Removed   bool       // every path of the changeset is applied: it was removed from the store
	Remaining int        // paths of the changeset still to apply
}

// Apply makes the originals of the selected changes (cs, a subset of
// Changes()) what the changeset holds. A path whose original changed since
// the run started is a conflict, listed and skipped unless opts.Force; a
// path that already equals the result counts as applied, so that an
// interrupted apply can be run again to completion. Files are written to
// a temporary name in the same directory, synced and renamed into place;
// symlinks are made under a temporary name and renamed; deletions go
// deepest first. Once every path of the changeset is applied it is
// removed from the store; until then it is partial, and the applied paths
// are no longer part of Changes.
func (c *Changeset) Apply(cs []Change, opts ApplyOptions) (ApplyResult, error) {
	var res ApplyResult
	if c.State == StateRunning {
		return res, fmt.Errorf("applying changeset %s: %w", c.ID, ErrRunning)
	}
	unlock, err := c.lock()
	if err != nil {
		return res, err
	}
	defer unlock()
	log, err := os.OpenFile(filepath.Join(c.dir, appliedFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return res, fmt.Errorf("applying changeset %s: %w", c.ID, err)
	}
	defer log.Close()
	// Deletions first, children before their directory; then the rest,
	// directories before what they hold.
	var dels, puts []Change
	for _, ch := range cs {
		if ch.Kind == KindDeleted {
			dels = append(dels, ch)
		} else {
			puts = append(puts, ch)
		}
	}
	sort.SliceStable(dels, func(i, j int) bool { return dels[i].Path > dels[j].Path })
	sort.SliceStable(puts, func(i, j int) bool { return puts[i].Path < puts[j].Path })
	// Deletions, directories and type changes go one by one in that order;
	// then files and symlinks, which depend on nothing but their directory,
	// are written by a few workers at once (most of their time is fsync).
	var serial, parallel []Change
	for _, ch := range append(dels, puts...) {
		if ch.Kind != KindDeleted && ch.Kind != KindType && (ch.After.Type == TypeFile || ch.After.Type == TypeSymlink) {
			parallel = append(parallel, ch)
		} else {
			serial = append(serial, ch)
		}
	}
	var mu sync.Mutex
	var firstErr error
	marked := false
	one := func(ch Change) error {
		st, err := c.status(ch)
		if err != nil {
			return fmt.Errorf("applying %s: %w", c.Display(ch.Mount, ch.Path), err)
		}
		if st == statusConflict && !opts.Force {
			mu.Lock()
			res.Conflicts = append(res.Conflicts, Conflict{ch, c.Display(ch.Mount, ch.Path), "the original changed since the run started"})
			mu.Unlock()
			return nil
		}
		if st != statusApplied {
			mu.Lock()
			if !marked && c.State != StatePartial {
				c.State = StatePartial
				if err := c.save(); err != nil {
					mu.Unlock()
					return err
				}
			}
			marked = true
			mu.Unlock()
			if err := c.applyOne(ch, opts.Force); err != nil {
				var ne notEmpty
				var pl parentLink
				reason := ""
				switch {
				case errors.As(err, &ne):
					reason = "the directory holds files the changeset does not delete"
				case errors.As(err, &pl):
					reason = "a parent directory is a symbolic link in the original (" + pl.link + "); apply the parent first"
				}
				if reason != "" {
					mu.Lock()
					res.Conflicts = append(res.Conflicts, Conflict{ch, c.Display(ch.Mount, ch.Path), reason})
					mu.Unlock()
					return nil
				}
				return fmt.Errorf("applying %s: %w", c.Display(ch.Mount, ch.Path), err)
			}
		}
		line, _ := json.Marshal(struct{ Mount, Path string }{ch.Mount, ch.Path})
		mu.Lock()
		_, err = log.Write(append(line, '\n'))
		res.Applied = append(res.Applied, ch)
		mu.Unlock()
		if err != nil {
			return fmt.Errorf("applying changeset %s: recording %s: %w", c.ID, ch.Path, err)
		}
		if opts.Pause > 0 {
			time.Sleep(opts.Pause)
		}
		return nil
	}
	for _, ch := range serial {
		if err := one(ch); err != nil {
			return res, err
		}
	}
	work := make(chan Change)
	var wg sync.WaitGroup
	for range min(applyWorkers, len(parallel)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ch := range work {
				if err := one(ch); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, ch := range parallel {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			break
		}
		work <- ch
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return res, firstErr
	}
	sortApplied(res)
	left, err := c.Changes()
	if err != nil {
		return res, err
	}
	res.Remaining = len(left)
	if len(left) == 0 {
		if err := c.remove(); err != nil {
			return res, err
		}
		res.Removed = true
		return res, nil
	}
	if c.State != StatePartial && len(res.Applied) > 0 {
		c.State = StatePartial
		if err := c.save(); err != nil {
			return res, err
		}
	}
	return res, nil
}

// applyWorkers is how many files apply writes at once.
const applyWorkers = 8

// sortApplied puts what the workers did in path order.
func sortApplied(res ApplyResult) {
	sort.SliceStable(res.Applied, func(i, j int) bool { return res.Applied[i].Path < res.Applied[j].Path })
	sort.SliceStable(res.Conflicts, func(i, j int) bool { return res.Conflicts[i].Path < res.Conflicts[j].Path })
}

// notEmpty: a directory to delete or replace holds entries the changeset
// does not delete.
type notEmpty struct{ path string }

func (e notEmpty) Error() string { return e.path + ": directory not empty" }

// applyOne makes one original path what the changeset holds.
func (c *Changeset) applyOne(ch Change, force bool) error {
	m, _ := c.Mount(ch.Mount)
	if err := checkParents(m.Source, ch.Path); err != nil {
		return err
	}
	dst := c.source(ch.Mount, ch.Path)
	cur, err := lstatEntry(dst, ch.Path)
	if err != nil {
		return err
	}
	a := ch.After
	if a.Type == TypeNone {
		return removePath(dst, cur, force)
	}
	if ch.Kind == KindMode && cur.Type == a.Type {
		if a.Type == TypeSymlink {
			return nil
		}
		return os.Chmod(dst, applyMode(a))
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	switch a.Type {
	case TypeDir:
		if cur.Type == TypeDir {
			return os.Chmod(dst, a.Mode)
		}
		if cur.Type != TypeNone {
			if err := removePath(dst, cur, force); err != nil {
				return err
			}
		}
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		return os.Chmod(dst, a.Mode)
	case TypeSymlink:
		tmp := c.tempName(dst)
		os.Remove(tmp)
		if err := os.Symlink(a.Target, tmp); err != nil {
			return err
		}
		return c.replace(tmp, dst, cur, force)
	case TypeFile:
		tmp := c.tempName(dst)
		if err := copyFile(c.result(ch.Mount, ch.Path), tmp, a); err != nil {
			os.Remove(tmp)
			return err
		}
		return c.replace(tmp, dst, cur, force)
	}
	return fmt.Errorf("cannot apply a %s", a.Type)
}

// applyMode is the mode apply gives a path: the sandbox's, except that a
// file never gets setuid or setgid (it must not run with the rights of
// whoever applies it).
func applyMode(s Side) fs.FileMode {
	if s.Type == TypeFile {
		return s.Mode &^ (fs.ModeSetuid | fs.ModeSetgid)
	}
	return s.Mode
}

// parentLink: a parent directory of the path is a symbolic link on the
// host; writing or deleting through it could reach outside the mount.
type parentLink struct{ link string }

func (e parentLink) Error() string { return e.link + " is a symbolic link" }

// checkParents returns a parentLink error when a directory between root
// and rel is a symbolic link.
func checkParents(root, rel string) error {
	dir := parentOf(rel)
	if dir == "" {
		return nil
	}
	p := root
	for _, part := range strings.Split(dir, "/") {
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil // created as a directory by apply
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return parentLink{p}
		}
		if !fi.IsDir() {
			return nil // MkdirAll will say what is wrong
		}
	}
	return nil
}

// replace renames tmp over dst; a directory there must go first (rename
// cannot replace a directory with a file).
func (c *Changeset) replace(tmp, dst string, cur Entry, force bool) error {
	if cur.Type == TypeDir {
		if err := removePath(dst, cur, force); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// removePath deletes an original: a directory only when empty (its
// children are deleted before it), unless force.
func removePath(p string, cur Entry, force bool) error {
	switch cur.Type {
	case TypeNone:
		return nil
	case TypeDir:
		err := os.Remove(p)
		if err != nil && (errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST)) {
			if force {
				return os.RemoveAll(p)
			}
			return notEmpty{p}
		}
		return err
	}
	err := os.Remove(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// tempName is the temporary name apply writes dst under: in the same
// directory, hidden, named after the changeset so that a later apply or
// discard of it finds what a killed one left.
func (c *Changeset) tempName(dst string) string {
	base := filepath.Base(dst)
	suffix := ".propio-" + c.ID + ".tmp"
	if len(base)+len(suffix)+1 > 255 {
		h := sha256.Sum256([]byte(base))
		base = hex.EncodeToString(h[:8])
	}
	return filepath.Join(filepath.Dir(dst), "."+base+suffix)
}

// copyFile writes the changeset's file src to dst (a new file), with the
// mode of a, synced to disk, checking that the content is the one sealed.
func copyFile(src, dst string, a Side) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		os.Remove(dst) // left by a killed apply
		out, err = os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_EXCL, 0o600)
	}
	if err != nil {
		return err
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(out, h), in); err != nil {
		out.Close()
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); a.SHA256 != "" && got != a.SHA256 {
		out.Close()
		return fmt.Errorf("the changeset's copy of the file changed since it was sealed (sha256 %s, sealed %s)", got[:12], a.SHA256[:12])
	}
	if err := out.Chmod(applyMode(a)); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Discard removes the changeset from the store without touching any
// original. A running changeset is refused (ErrRunning) unless force.
func (c *Changeset) Discard(force bool) error {
	if c.State == StateRunning && !force {
		return fmt.Errorf("discarding changeset %s: %w", c.ID, ErrRunning)
	}
	unlock, err := c.lock()
	if err != nil {
		return err
	}
	defer unlock()
	return c.remove()
}

// ErrBusy: another apply or discard of the changeset is under way.
var ErrBusy = errors.New("another apply or discard of this changeset is under way")

// lock takes the changeset's lock (an flock of its file "lock", which is
// never replaced, unlike meta.json), so that two applies, or an apply and a
// discard, do not run at once.
func (c *Changeset) lock() (func(), error) {
	f, err := os.OpenFile(filepath.Join(c.dir, "lock"), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking changeset %s: %w", c.ID, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("changeset %s: %w", c.ID, ErrBusy)
		}
		return nil, fmt.Errorf("locking changeset %s: %w", c.ID, err)
	}
	return func() { f.Close() }, nil
}

// remove deletes the store directory, and the temporary files a killed
// apply may have left beside the originals.
func (c *Changeset) remove() error {
	if data, err := os.ReadFile(filepath.Join(c.dir, changesFile)); err == nil {
		var doc changesDoc
		if json.Unmarshal(data, &doc) == nil {
			for _, ch := range doc.Changes {
				if ch.After.Type == TypeFile || ch.After.Type == TypeSymlink {
					tmp := c.tempName(c.source(ch.Mount, ch.Path))
					if strings.HasSuffix(tmp, ".tmp") {
						os.Remove(tmp)
					}
				}
			}
		}
	}
	// Overlay work directories hold a d--------- work/ of the kernel's.
	filepath.WalkDir(c.dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			if info, err := d.Info(); err == nil && info.Mode().Perm()&0o700 != 0o700 {
				os.Chmod(p, 0o700)
			}
		}
		return nil
	})
	if err := os.RemoveAll(c.dir); err != nil {
		return fmt.Errorf("removing changeset %s: %w", c.ID, err)
	}
	return nil
}

func lgetxattrSize(p, attr string) (int, error) {
	return unix.Lgetxattr(p, attr, nil)
}
