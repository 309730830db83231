// Package treetar moves a directory tree through a tar stream and back:
// modes, nanosecond modification times, symbolic links as links, numeric
// owners (restored when extracting as root). Extracting never writes
// outside its directory. It knows nothing else of this module.
package treetar

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/propio/propio-sandbox/internal/fsutil"
	"golang.org/x/sys/unix"
)

// Write writes the tree at root as a tar stream under the name prefix,
// root's own entry first, with numeric owners, nanosecond mtimes (PAX) and
// symbolic links as links. Sockets are left out; hard links are written as
// files.
func Write(w io.Writer, root, prefix string) error { return write(w, root, prefix, true) }

// WriteBelow writes what is below root as Write does, with names relative
// to it and without root's own entry: an archive to unpack into a
// directory whose owner and mode are not the tree's (a Pod's volume).
func WriteBelow(w io.Writer, root string) error { return write(w, root, "", false) }

func write(w io.Writer, root, prefix string, withRoot bool) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !withRoot && p == root {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSocket != 0 {
			return nil
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		rel, _ := filepath.Rel(root, p)
		name := path.Join(prefix, filepath.ToSlash(rel))
		if fi.IsDir() {
			name = strings.TrimSuffix(name, "/") + "/"
		}
		hdr.Name = name
		hdr.Uname, hdr.Gname = "", ""
		hdr.Format = tar.FormatPAX
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, hdr.Size)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("archiving %s: %w", root, err)
	}
	return tw.Close()
}

// Extract makes dir (which must not exist) hold the tar stream's tree,
// with modes, mtimes, symbolic links and, as root, owners. An entry may not
// leave dir, nor be written through a symbolic link the stream made.
func Extract(r io.Reader, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	dirs := map[string]bool{"": true} // the directories made, by relative path
	type stamp struct {
		rel   string
		mtime time.Time
		mode  fs.FileMode
	}
	var dirStamps []stamp
	root := os.Geteuid() == 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		rel := path.Clean(strings.TrimPrefix(hdr.Name, "/"))
		if rel == "." {
			rel = ""
		}
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return fmt.Errorf("entry %q leaves the tree", hdr.Name)
		}
		if rel != "" && !dirs[parentOf(rel)] {
			return fmt.Errorf("entry %q: its directory %q is not one of the tree's", hdr.Name, parentOf(rel))
		}
		full := filepath.Join(dir, filepath.FromSlash(rel))
		mode := fs.FileMode(hdr.Mode & 0o777)
		for bit, m := range map[int64]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
			if hdr.Mode&bit != 0 {
				mode |= m
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if rel != "" {
				if err := os.Mkdir(full, 0o700); err != nil {
					return err
				}
				dirs[rel] = true
			}
			dirStamps = append(dirStamps, stamp{rel, hdr.ModTime, mode})
		case tar.TypeReg:
			if err := fsutil.WriteNew(full, tr); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, full); err != nil {
				return err
			}
		case tar.TypeLink:
			target := path.Clean(strings.TrimPrefix(hdr.Linkname, "/"))
			if target == ".." || strings.HasPrefix(target, "../") || !dirs[parentOf(target)] {
				return fmt.Errorf("hard link %q to %q leaves the tree", hdr.Name, hdr.Linkname)
			}
			if err := os.Link(filepath.Join(dir, filepath.FromSlash(target)), full); err != nil {
				return err
			}
			continue
		case tar.TypeFifo:
			if err := unix.Mkfifo(full, 0o600); err != nil {
				return err
			}
		default:
			continue // devices are not the agent's to make
		}
		if root {
			if err := os.Lchown(full, hdr.Uid, hdr.Gid); err != nil {
				return err
			}
		}
		if hdr.Typeflag == tar.TypeSymlink {
			ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
			unix.UtimesNanoAt(unix.AT_FDCWD, full, ts, unix.AT_SYMLINK_NOFOLLOW)
			continue
		}
		if hdr.Typeflag != tar.TypeDir {
			if err := os.Chmod(full, mode); err != nil {
				return err
			}
			if err := os.Chtimes(full, hdr.ModTime, hdr.ModTime); err != nil {
				return err
			}
		}
	}
	// Directories last, deepest first: making their entries changed their
	// mtimes, and a read-only one could not have been filled.
	for i := len(dirStamps) - 1; i >= 0; i-- {
		s := dirStamps[i]
		full := filepath.Join(dir, filepath.FromSlash(s.rel))
		if err := os.Chmod(full, s.mode); err != nil {
			return err
		}
		if err := os.Chtimes(full, s.mtime, s.mtime); err != nil {
			return err
		}
	}
	return nil
}

func parentOf(rel string) string {
	if i := strings.LastIndex(rel, "/"); i >= 0 {
		return rel[:i]
	}
	return ""
}

// Replace replaces the directory to with the tar stream's tree: extracted
// next to it first (Extract), then swapped in, so that a failure leaves to
// as it was.
func Replace(r io.Reader, to string) error {
	tmp := to + ".new"
	os.RemoveAll(tmp)
	if err := Extract(r, tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	old := to + ".old"
	os.RemoveAll(old)
	if err := os.Rename(to, old); err != nil && !errors.Is(err, fs.ErrNotExist) {
		os.RemoveAll(tmp)
		return fmt.Errorf("replacing %s: %w", to, err)
	}
	if err := os.Rename(tmp, to); err != nil {
		os.Rename(old, to)
		os.RemoveAll(tmp)
		return fmt.Errorf("replacing %s: %w", to, err)
	}
	os.RemoveAll(old)
	return nil
}
