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
	"syscall"
	"time"

	"github.com/moby/moby/client"
	"github.com/propio/propio-sandbox/internal/backend"
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
// en.Name, then the tree at en.From under that name.
func writeEntryTar(w io.Writer, en backend.Entry) (backend.Copied, error) {
	var c backend.Copied
	tw := tar.NewWriter(w)
	now := time.Now()
	if err := tw.WriteHeader(&tar.Header{Name: en.Name, Typeflag: tar.TypeReg, Mode: 0o444, ModTime: now, Format: tar.FormatPAX}); err != nil {
		return c, err
	}
	err := filepath.WalkDir(en.From, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(en.From, p)
		rel = filepath.ToSlash(rel)
		if rel != "." && en.Skip[rel] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return writeEntryFile(tw, en, p, rel, fi, &c)
	})
	if err != nil {
		return c, fmt.Errorf("archiving %s: %w", en.From, err)
	}
	return c, tw.Close()
}

// writeEntryFile writes one file of the tree, when it is a directory, a
// regular file or a symbolic link, and counts it in c.
func writeEntryFile(tw *tar.Writer, en backend.Entry, p, rel string, fi fs.FileInfo, c *backend.Copied) error {
	link := ""
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		var err error
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	case fi.IsDir(), fi.Mode().IsRegular():
	default:
		return nil // sockets, devices, fifos
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	hdr.Name = path.Join(en.Name, rel)
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Mode &^= 0o6000
	hdr.Uname, hdr.Gname = "", ""
	hdr.Format = tar.FormatPAX
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	var body io.Reader
	if hdr.Typeflag == tar.TypeReg {
		// Opened without following a link, and checked to be the file that
		// was walked: a file replaced by a link since leads nowhere else.
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if st, err := f.Stat(); err != nil || !os.SameFile(st, fi) {
			return fmt.Errorf("%s changed while it was copied", p)
		}
		if body, hdr.Size, err = fileBody(f, hdr.Size); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if en.Max > 0 && c.Bytes+hdr.Size > en.Max {
			return fmt.Errorf("%s: %w (%d bytes)", p, backend.ErrEntryTooLarge, en.Max)
		}
		c.Bytes += hdr.Size
	}
	if !fi.IsDir() {
		c.Files++
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if body == nil {
		return nil
	}
	if _, err := io.CopyN(tw, body, hdr.Size); err != nil {
		return fmt.Errorf("%s: shorter than it was (%w): it changed while it was copied", p, err)
	}
	// Read to its end: a file longer than it said is not cut short.
	if n, _ := body.Read(make([]byte, 1)); n > 0 {
		return fmt.Errorf("%s grew past %d bytes while it was copied", p, hdr.Size)
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
