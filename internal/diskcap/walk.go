// Package diskcap measures what a sandbox writes to this host's file systems
// and watches it against a cap (resources.disk), where neither the kernel
// nor the engine's storage can enforce one.
//
// A walk measures the blocks a tree holds (each inode once, links never
// followed); statfs of the file systems under it is the cheap trigger that
// says when a walk is worth its cost; the files the sandbox's processes hold
// open after deleting them, which no walk sees, are counted from /proc.
// Watch polls gauges built of these at intervals that adapt to what a
// measure costs, and says when one has grown past the cap.
//
// It never talks to a container engine and never prints: the engine gives
// it the paths and processes to look at, and acts on what it reports.
package diskcap

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/propio/propio-sandbox/internal/fsutil"
)

// InodeCharge is what each file and directory counts for besides its
// blocks: about an inode's own size on disk, so that a tree of many empty
// files (which have no blocks, but fill a file system's metadata) counts too.
const InodeCharge = 256

// Usage is what one walk of some trees found.
type Usage struct {
	// Bytes is the blocks (st_blocks × 512) of every file, directory and
	// link, each inode once however many names it has, plus InodeCharge
	// for each.
	Bytes int64
	// FS maps each file system the trees span (by device number) to a path
	// on it, for statfs.
	FS map[uint64]string
	// Unreadable are the directories the walk could not list (by device
	// and inode): what they hold is not in Bytes.
	Unreadable map[FileID]string
}

// FileID names an inode.
type FileID struct{ Dev, Ino uint64 }

// Walk measures the trees at roots, unless ctx ends first. A root that does not exist counts
// nothing; a directory that cannot be listed is recorded in Unreadable. A
// root below another root is walked once, as part of it.
//
// It walks at the lowest CPU priority (on Linux), so that a launch or the
// sandbox's own work goes first: a walk runs beside them on a machine of a
// few cores.
func Walk(ctx context.Context, roots []string) (Usage, error) {
	var u Usage
	var err error
	lowPriority(func() { u, err = walk(ctx, roots) })
	return u, err
}

func walk(ctx context.Context, roots []string) (Usage, error) {
	u := Usage{FS: map[uint64]string{}, Unreadable: map[FileID]string{}}
	w := walker{ctx: ctx, u: &u, seen: map[FileID]bool{}}
	for _, root := range Disjoint(roots) {
		if err := w.root(root); err != nil {
			return Usage{}, err
		}
	}
	if err := ctx.Err(); err != nil {
		return Usage{}, err
	}
	return u, nil
}

// Disjoint returns roots without the ones that are below (or equal to)
// another, so that nothing is counted twice.
func Disjoint(roots []string) []string {
	var out []string
	for i, r := range roots {
		r = filepath.Clean(r)
		inside := false
		for j, o := range roots {
			o = filepath.Clean(o)
			if i != j && (fsutil.Within(o, r) && (o != r || j < i)) {
				inside = true
				break
			}
		}
		if !inside {
			out = append(out, r)
		}
	}
	return out
}

type walker struct {
	ctx  context.Context // a walk stops when it ends
	u    *Usage
	seen map[FileID]bool // inodes with more than one name, counted once
}

func (w *walker) root(root string) error {
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return &os.PathError{Op: "lstat", Path: root, Err: err}
	}
	w.count(&st, root)
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		w.unreadable(&st, root)
		return nil
	}
	w.dir(fd, root)
	return nil
}

// count adds one inode, once.
func (w *walker) count(st *unix.Stat_t, path string) {
	id := FileID{uint64(st.Dev), st.Ino}
	if _, ok := w.u.FS[id.Dev]; !ok {
		w.u.FS[id.Dev] = path
	}
	if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if w.seen[id] {
			return
		}
		w.seen[id] = true
	}
	w.u.Bytes += st.Blocks*512 + InodeCharge
}

func (w *walker) unreadable(st *unix.Stat_t, path string) {
	w.u.Unreadable[FileID{uint64(st.Dev), st.Ino}] = path
}

// dir walks the directory open at fd (and closes it). Entries are looked at
// relative to it, so that a link swapped in during the walk is never
// followed. One descriptor is open per level of depth.
func (w *walker) dir(fd int, path string) {
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if w.ctx.Err() != nil {
		return
	}
	for {
		names, err := f.Readdirnames(512)
		for _, name := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // gone since it was listed
			}
			p := path + "/" + name
			w.count(&st, p)
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue
			}
			sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				if !errors.Is(err, unix.ENOENT) {
					w.unreadable(&st, p)
				}
				continue
			}
			w.dir(sub, p)
		}
		if err != nil || len(names) == 0 {
			return
		}
	}
}
