package guard

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The operations below work on paths below a root directory that the
// sandbox could write, so each one walks the path a component at a time
// with O_NOFOLLOW: a symbolic link the sandbox planted in any component is
// never followed out of the root, whatever it does meanwhile.

// maxRead bounds what the guard reads of a file the sandbox may have made.
const maxRead = 1 << 20

// errLink is returned for a path through, or to, a symbolic link.
var errLink = errors.New("is a symbolic link")

// openDir opens the directory root/rel without following any link below root.
func openDir(root, rel string) (int, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: root, Err: err}
	}
	if rel == "." || rel == "" {
		return fd, nil
	}
	for _, name := range strings.Split(rel, "/") {
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				err = linkOrNotDir(root, rel, err)
			}
			return -1, &fs.PathError{Op: "open", Path: filepath.Join(root, rel), Err: err}
		}
		fd = next
	}
	return fd, nil
}

func linkOrNotDir(root, rel string, err error) error {
	if errors.Is(err, unix.ELOOP) {
		return errLink
	}
	// O_NOFOLLOW|O_DIRECTORY on a link gives ENOTDIR on some systems.
	for p := rel; p != "." && p != ""; p = path.Dir(p) {
		if fi, lerr := os.Lstat(filepath.Join(root, p)); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return errLink
		}
	}
	return err
}

// stat is what the guard knows of one entry, without following it.
type stat struct {
	mode  fs.FileMode
	dev   uint64
	ino   uint64
	nlink uint64
	ctime time.Time
}

func fromUnix(st *unix.Stat_t) stat {
	s := stat{dev: uint64(st.Dev), ino: uint64(st.Ino), nlink: uint64(st.Nlink), ctime: time.Unix(st.Ctim.Unix())}
	s.mode = fs.FileMode(st.Mode & 0o777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		s.mode |= fs.ModeDir
	case unix.S_IFLNK:
		s.mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		s.mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		s.mode |= fs.ModeSocket
	case unix.S_IFCHR:
		s.mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		s.mode |= fs.ModeDevice
	}
	if st.Mode&unix.S_ISUID != 0 {
		s.mode |= fs.ModeSetuid
	}
	if st.Mode&unix.S_ISGID != 0 {
		s.mode |= fs.ModeSetgid
	}
	if st.Mode&unix.S_ISVTX != 0 {
		s.mode |= fs.ModeSticky
	}
	return s
}

// lstat reads root/rel without following a link anywhere below root.
func lstat(root, rel string) (stat, error) {
	dfd, err := openDir(root, path.Dir(rel))
	if err != nil {
		return stat{}, err
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, path.Base(rel), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return stat{}, &fs.PathError{Op: "lstat", Path: filepath.Join(root, rel), Err: err}
	}
	return fromUnix(&st), nil
}

// exists reports whether anything is at root/rel (a link counts).
func exists(root, rel string) bool {
	_, err := lstat(root, rel)
	return err == nil
}

// readFile reads the regular file root/rel, at most maxRead bytes, refusing
// a link, a FIFO, a device or anything else that is not a regular file
// (opening those could block or have effects).
func readFile(root, rel string) ([]byte, error) {
	dfd, err := openDir(root, path.Dir(rel))
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	full := filepath.Join(root, rel)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, path.Base(rel), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, &fs.PathError{Op: "lstat", Path: full, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s is not a regular file (%s)", full, fromUnix(&st).mode.Type())
	}
	fd, err := unix.Openat(dfd, path.Base(rel), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: full, Err: err}
	}
	f := os.NewFile(uintptr(fd), full)
	defer f.Close()
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s is not a regular file", full)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxRead+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxRead {
		return nil, fmt.Errorf("%s is larger than %d bytes", full, maxRead)
	}
	return data, nil
}

// readDir lists the directory root/rel without following a link.
func readDir(root, rel string) ([]string, error) {
	fd, err := openDir(root, rel)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), filepath.Join(root, rel))
	defer f.Close()
	return f.Readdirnames(-1)
}

// mkdir makes the directory root/rel (its parent must exist).
func mkdir(root, rel string, perm uint32) error {
	dfd, err := openDir(root, path.Dir(rel))
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Mkdirat(dfd, path.Base(rel), perm); err != nil {
		return &fs.PathError{Op: "mkdir", Path: filepath.Join(root, rel), Err: err}
	}
	return nil
}

// replaceFile makes root/rel hold data, atomically: a new file beside it,
// synced, renamed over it.
func replaceFile(root, rel string, data []byte, perm uint32) error {
	dfd, err := openDir(root, path.Dir(rel))
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	tmp := "." + path.Base(rel) + ".propio-guard.tmp"
	unix.Unlinkat(dfd, tmp, 0)
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return &fs.PathError{Op: "create", Path: filepath.Join(root, path.Dir(rel), tmp), Err: err}
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, path.Base(rel))
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("writing %s: %w", filepath.Join(root, rel), err)
	}
	return nil
}

// clearSetID removes the setuid and setgid bits of the regular file
// root/rel, if it still is the file (same device and inode) that was seen.
func clearSetID(root, rel string, seen stat) error {
	dfd, err := openDir(root, path.Dir(rel))
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, path.Base(rel), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: filepath.Join(root, rel), Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || uint64(st.Dev) != seen.dev || uint64(st.Ino) != seen.ino {
		return fmt.Errorf("%s changed while it was being checked", filepath.Join(root, rel))
	}
	return unix.Fchmod(fd, uint32(st.Mode&0o1777))
}

// remove removes root/rel and, for a directory, all below it, never
// following a link.
func remove(root, rel string) error {
	dfd, err := openDir(root, path.Dir(rel))
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	return removeAt(dfd, path.Base(rel), filepath.Join(root, rel), 0)
}

func removeAt(dfd int, name, full string, depth int) error {
	if depth > 256 {
		return fmt.Errorf("%s: too deep", full)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return &fs.PathError{Op: "lstat", Path: full, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(dfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return &fs.PathError{Op: "remove", Path: full, Err: err}
		}
		return nil
	}
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: full, Err: err}
	}
	f := os.NewFile(uintptr(fd), full)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n, full+"/"+n, depth+1); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "remove", Path: full, Err: err}
	}
	return nil
}

// moveOut moves root/rel to dest (a path outside the root, whose parent
// exists): renamed when both are on one file system, else copied (files,
// directories and links; other kinds are not copied) and removed.
func moveOut(root, rel, dest string) error {
	dfd, err := openDir(root, path.Dir(rel))
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	ddir, err := unix.Open(filepath.Dir(dest), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: filepath.Dir(dest), Err: err}
	}
	defer unix.Close(ddir)
	err = unix.Renameat(dfd, path.Base(rel), ddir, filepath.Base(dest))
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EXDEV) {
		return &fs.PathError{Op: "rename", Path: filepath.Join(root, rel), Err: err}
	}
	if err := copyAt(dfd, path.Base(rel), filepath.Join(root, rel), dest, 0); err != nil {
		return err
	}
	return removeAt(dfd, path.Base(rel), filepath.Join(root, rel), 0)
}

func copyAt(dfd int, name, full, dest string, depth int) error {
	if depth > 256 {
		return fmt.Errorf("%s: too deep", full)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "lstat", Path: full, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		buf := make([]byte, 4096)
		n, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			return &fs.PathError{Op: "readlink", Path: full, Err: err}
		}
		return os.Symlink(string(buf[:n]), dest)
	case unix.S_IFDIR:
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: full, Err: err}
		}
		f := os.NewFile(uintptr(fd), full)
		defer f.Close()
		if err := os.Mkdir(dest, 0o700); err != nil {
			return err
		}
		names, err := f.Readdirnames(-1)
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := copyAt(fd, n, full+"/"+n, filepath.Join(dest, n), depth+1); err != nil {
				return err
			}
		}
		return nil
	case unix.S_IFREG:
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: full, Err: err}
		}
		in := os.NewFile(uintptr(fd), full)
		defer in.Close()
		out, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, in)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		return err
	}
	return nil // a FIFO, socket or device: nothing worth keeping
}

// entry is one name of a directory, with what lstat says of it.
type entry struct {
	name string
	stat
}

// walkTree calls fn for each directory below root (root first, as "."),
// with its entries, never following a link: each directory is opened a
// component at a time with O_NOFOLLOW, each entry read with fstatat. A few
// directories are read at once; fn may be called concurrently. Directories
// that cannot be read (gone, or not readable) are skipped.
func walkTree(root string, fn func(dir string, entries []entry)) error {
	const workers = 4
	var (
		mu      sync.Mutex
		cond    = sync.NewCond(&mu)
		queue   = []string{"."}
		busy    int
		walkErr error
	)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				for len(queue) == 0 && busy > 0 {
					cond.Wait()
				}
				if len(queue) == 0 {
					mu.Unlock()
					cond.Broadcast()
					return
				}
				dir := queue[len(queue)-1]
				queue = queue[:len(queue)-1]
				busy++
				mu.Unlock()

				entries, err := readEntries(root, dir)
				if err == nil {
					fn(dir, entries)
				}
				mu.Lock()
				busy--
				if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrPermission) && !errors.Is(err, errLink) && walkErr == nil && dir == "." {
					walkErr = err
				}
				for _, e := range entries {
					if e.mode.IsDir() {
						queue = append(queue, path.Join(dir, e.name))
					}
				}
				mu.Unlock()
				cond.Broadcast()
			}
		}()
	}
	wg.Wait()
	return walkErr
}

// readEntries lists root/dir with each entry's lstat.
func readEntries(root, dir string) ([]entry, error) {
	fd, err := openDir(root, dir)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), filepath.Join(root, dir))
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	out := make([]entry, 0, len(names))
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		out = append(out, entry{name: n, stat: fromUnix(&st)})
	}
	return out, nil
}
