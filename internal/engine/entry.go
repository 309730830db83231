package engine

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moby/moby/client"
	"github.com/propio/propio-sandbox/internal/backend"
	"golang.org/x/sys/unix"
)

// CopyEntry makes a copy of the host path e.From the entry e.Name at the
// root of the volume, through a helper container's archive API, while the
// volume may be mounted in the sandbox. The archive's first entry is an
// empty file of that name, which takes the place of what was there (the API
// replaces a directory with a file when told it may); the copy then takes
// the place of that file.
func (e *Engine) CopyEntry(ctx context.Context, v backend.Volume, en backend.Entry) (backend.Copied, error) {
	if en.Name == "" || en.Name == "." || en.Name == ".." || path.Base(en.Name) != en.Name {
		return backend.Copied{}, fmt.Errorf("copying %s into volume %s: %q is not a name", en.From, v.Name, en.Name)
	}
	id, remove, err := e.helper(ctx, v.Image, v.Name, v.Labels)
	if err != nil {
		return backend.Copied{}, err
	}
	defer remove()
	pr, pw := io.Pipe()
	var copied backend.Copied
	go func() {
		var err error
		copied, err = writeEntryTar(pw, en)
		pw.CloseWithError(err)
	}()
	_, err = e.cli.Client().CopyToContainer(ctx, id, client.CopyToContainerOptions{DestinationPath: copyMount, Content: pr, AllowOverwriteDirWithFile: true})
	pr.CloseWithError(errors.New("copy ended"))
	if err != nil {
		return backend.Copied{}, fmt.Errorf("copying %s into volume %s: %w", en.From, v.Name, err)
	}
	return copied, nil
}

// writeEntryTar writes the tar stream of CopyEntry: an empty file named
// en.Name, then the tree at en.From under that name. The tree is walked by
// descriptors, each file and directory opened below its directory's
// without following a link, and en.From itself a component at a time the
// same way: a link swapped in anywhere while it is copied (by a sandbox
// that can write there) fails the copy, or is copied as a link, and never
// leads the copy elsewhere.
func writeEntryTar(w io.Writer, en backend.Entry) (backend.Copied, error) {
	var c backend.Copied
	tw := tar.NewWriter(w)
	now := time.Now()
	if err := tw.WriteHeader(&tar.Header{Name: en.Name, Typeflag: tar.TypeReg, Mode: 0o444, ModTime: now, Format: tar.FormatPAX}); err != nil {
		return c, err
	}
	root, err := openNoFollow(en.From)
	if err == nil {
		err = writeEntryAt(tw, en, root, ".", &c)
		root.Close()
	}
	if err != nil {
		return c, fmt.Errorf("archiving %s: %w", en.From, err)
	}
	return c, tw.Close()
}

// openNoFollow opens the absolute path p a component at a time, never
// following a link: a link anywhere in it fails the open (ELOOP).
func openNoFollow(p string) (*os.File, error) {
	fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: "/", Err: err}
	}
	for _, name := range strings.Split(strings.Trim(p, "/"), "/") {
		if name == "" {
			continue
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: p, Err: err}
		}
		fd = next
	}
	return os.NewFile(uintptr(fd), p), nil
}

// writeEntryAt writes f, open at rel below en.From, when it is a regular
// file or a directory, and all below a directory; it counts them in c.
func writeEntryAt(tw *tar.Writer, en backend.Entry, f *os.File, rel string, c *backend.Copied) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Mode().IsRegular() {
		return writeEntryFile(tw, en, f, rel, fi, c)
	}
	if !fi.IsDir() {
		return nil // sockets, devices, fifos
	}
	hdr, err := tar.FileInfoHeader(fi, "")
	if err != nil {
		return fmt.Errorf("%s: %w", f.Name(), err)
	}
	if err := writeEntryHeader(tw, en, rel, hdr, c); err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("%s: %w", f.Name(), err)
	}
	slices.Sort(names)
	dir := int(f.Fd())
	for _, name := range names {
		crel := path.Join(rel, name)
		if en.Skip[crel] {
			continue
		}
		at := filepath.Join(f.Name(), name)
		var st unix.Stat_t
		if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "lstat", Path: at, Err: err}
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			err = writeEntryLink(tw, en, dir, name, crel, &st, c)
		case unix.S_IFDIR, unix.S_IFREG:
			fd, oerr := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
			if oerr != nil {
				return &os.PathError{Op: "open", Path: at, Err: oerr}
			}
			child := os.NewFile(uintptr(fd), at)
			err = writeEntryAt(tw, en, child, crel, c)
			child.Close()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// writeEntryLink writes the symbolic link name of the directory dir, as a
// link: its target read below dir, never followed.
func writeEntryLink(tw *tar.Writer, en backend.Entry, dir int, name, rel string, st *unix.Stat_t, c *backend.Copied) error {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(dir, name, buf)
		if err != nil {
			return &os.PathError{Op: "readlink", Path: path.Join(en.From, rel), Err: err}
		}
		if n < len(buf) {
			return writeEntryHeader(tw, en, rel, &tar.Header{
				Typeflag: tar.TypeSymlink, Linkname: string(buf[:n]),
				Mode: int64(st.Mode & 0o777), Uid: int(st.Uid), Gid: int(st.Gid), ModTime: time.Unix(st.Mtim.Unix()),
			}, c)
		}
		buf = make([]byte, 2*len(buf))
	}
}

// writeEntryHeader writes hdr as the entry rel of the tree, and counts it
// in c: setuid and setgid dropped, no names of owners, no access or change
// times.
func writeEntryHeader(tw *tar.Writer, en backend.Entry, rel string, hdr *tar.Header, c *backend.Copied) error {
	hdr.Name = path.Join(en.Name, rel)
	if hdr.Typeflag == tar.TypeDir {
		hdr.Name += "/"
	} else {
		c.Files++
	}
	hdr.Mode &^= 0o6000
	hdr.Uname, hdr.Gname = "", ""
	hdr.Format = tar.FormatPAX
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	return tw.WriteHeader(hdr)
}

// writeEntryFile writes the regular file f, open at rel, to its end, and
// counts it in c.
func writeEntryFile(tw *tar.Writer, en backend.Entry, f *os.File, rel string, fi fs.FileInfo, c *backend.Copied) error {
	hdr, err := tar.FileInfoHeader(fi, "")
	if err != nil {
		return fmt.Errorf("%s: %w", f.Name(), err)
	}
	body, size, err := fileBody(f, fi.Size())
	if err != nil {
		return fmt.Errorf("%s: %w", f.Name(), err)
	}
	if en.Max > 0 && c.Bytes+size > en.Max {
		return fmt.Errorf("%s: %w (%d bytes)", f.Name(), backend.ErrEntryTooLarge, en.Max)
	}
	hdr.Size = size
	c.Bytes += size
	if err := writeEntryHeader(tw, en, rel, hdr, c); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, body, size); err != nil {
		return fmt.Errorf("%s: shorter than it was (%w): it changed while it was copied", f.Name(), err)
	}
	// Read to its end: a file longer than it said is not cut short.
	if n, _ := body.Read(make([]byte, 1)); n > 0 {
		return fmt.Errorf("%s grew past %d bytes while it was copied", f.Name(), size)
	}
	return nil
}

// smallFile is the size up to which a file is read whole before it is
// archived, whatever its stat says.
const smallFile = 1 << 20

// fileBody is what a file holds to its end, and how long that is, read
// whole up to smallFile bytes: a file whose stat says less than it holds
// (the kernel's files say 0) is copied whole all the same. A larger one is
// taken at statSize, and its copy fails if it holds more or less.
func fileBody(f io.Reader, statSize int64) (io.Reader, int64, error) {
	head, err := io.ReadAll(io.LimitReader(f, smallFile+1))
	if err != nil {
		return nil, 0, err
	}
	if len(head) <= smallFile {
		return bytes.NewReader(head), int64(len(head)), nil
	}
	if statSize < int64(len(head)) {
		return nil, 0, fmt.Errorf("holds more than the %d bytes it says", statSize)
	}
	return io.MultiReader(bytes.NewReader(head), f), statSize, nil
}
