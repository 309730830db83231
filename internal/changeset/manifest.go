package changeset

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Type is the type of a file system entry.
type Type string

const (
	TypeNone    Type = ""        // no entry: added or deleted
	TypeFile    Type = "file"    // regular file
	TypeDir     Type = "dir"     // directory
	TypeSymlink Type = "symlink" // symbolic link
	TypeOther   Type = "other"   // device, fifo, socket: recorded, never changed
)

// Entry is the stat of one file system entry, by its slash-separated path
// relative to a mount's root ("" is never listed: the root itself).
type Entry struct {
	Path   string
	Type   Type
	Mode   fs.FileMode // permission and setuid/setgid/sticky bits only
	Size   int64
	Mtime  int64  // nanoseconds since the epoch
	Target string // symlink target
}

// sameStat says whether two stats of the same path describe the same
// content, as far as a stat can tell.
func sameStat(a, b Entry) bool {
	return a.Type == b.Type && a.Mode == b.Mode && a.Size == b.Size && a.Mtime == b.Mtime && a.Target == b.Target
}

// manifest is the sorted list of every entry under a root.
type manifest []Entry

// find returns the entry at p.
func (m manifest) find(p string) (Entry, bool) {
	i := sort.Search(len(m), func(i int) bool { return m[i].Path >= p })
	if i < len(m) && m[i].Path == p {
		return m[i], true
	}
	return Entry{}, false
}

// under returns the entries below directory p (not p itself), in order.
func (m manifest) under(p string) []Entry {
	prefix := p + "/"
	if p == "" {
		return m
	}
	i := sort.Search(len(m), func(i int) bool { return m[i].Path >= prefix })
	j := i
	for j < len(m) && strings.HasPrefix(m[j].Path, prefix) {
		j++
	}
	return m[i:j]
}

func modeBits(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

func typeOf(m uint32) Type {
	switch m & unix.S_IFMT {
	case unix.S_IFREG:
		return TypeFile
	case unix.S_IFDIR:
		return TypeDir
	case unix.S_IFLNK:
		return TypeSymlink
	}
	return TypeOther
}

// entryOf makes the Entry of a stat; target is read for a symlink by the caller.
func entryOf(p string, st *unix.Stat_t) Entry {
	return Entry{Path: p, Type: typeOf(uint32(st.Mode)), Mode: modeBits(uint32(st.Mode)), Size: st.Size, Mtime: st.Mtim.Nano()}
}

// lstatEntry stats one path (no symlink followed); TypeNone when it does not exist.
func lstatEntry(full, rel string) (Entry, error) {
	var st unix.Stat_t
	if err := unix.Lstat(full, &st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return Entry{Path: rel}, nil
		}
		return Entry{}, &fs.PathError{Op: "lstat", Path: full, Err: err}
	}
	e := entryOf(rel, &st)
	if e.Type == TypeSymlink {
		t, err := os.Readlink(full)
		if err != nil {
			return Entry{}, err
		}
		e.Target = t
	}
	if e.Type != TypeFile {
		e.Size = 0
	}
	return e, nil
}

// scanManifest stats every entry under root without reading any content.
// Directories are read with getdents and their entries stat'ed relative to
// the directory's descriptor, by a few goroutines at once, which keeps
// 100,000 files well under a second.
func scanManifest(root string) (manifest, error) {
	var (
		mu   sync.Mutex
		m    manifest
		errs []error
		wg   sync.WaitGroup
	)
	sem := make(chan struct{}, 2*runtime.GOMAXPROCS(0))
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	var walk func(fd int, dir string)
	walk = func(fd int, dir string) {
		f := os.NewFile(uintptr(fd), dir)
		defer f.Close()
		names, err := f.Readdirnames(-1)
		if err != nil {
			fail(fmt.Errorf("reading directory %s: %w", filepath.Join(root, dir), err))
			return
		}
		local := make([]Entry, 0, len(names))
		type sub struct {
			fd  int
			rel string
		}
		var subs []sub
		defer func() {
			for _, s := range subs { // left open by a failure
				if s.fd >= 0 {
					unix.Close(s.fd)
				}
			}
		}()
		for _, name := range names {
			rel := name
			if dir != "" {
				rel = dir + "/" + name
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue // removed while we looked
				}
				fail(fmt.Errorf("stat %s: %w", filepath.Join(root, rel), err))
				return
			}
			e := entryOf(rel, &st)
			switch e.Type {
			case TypeSymlink:
				buf := make([]byte, 256)
				for {
					n, err := unix.Readlinkat(fd, name, buf)
					if err != nil {
						fail(fmt.Errorf("reading symlink %s: %w", filepath.Join(root, rel), err))
						return
					}
					if n < len(buf) {
						e.Target = string(buf[:n])
						break
					}
					buf = make([]byte, 2*len(buf))
				}
				e.Size = 0
			case TypeDir:
				e.Size = 0
				sfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					fail(fmt.Errorf("opening directory %s: %w", filepath.Join(root, rel), err))
					return
				}
				subs = append(subs, sub{sfd, rel})
			}
			local = append(local, e)
		}
		mu.Lock()
		m = append(m, local...)
		mu.Unlock()
		for i, s := range subs {
			subs[i].fd = -1 // walk closes it
			select {
			case sem <- struct{}{}:
				wg.Add(1)
				go func() {
					defer wg.Done()
					walk(s.fd, s.rel)
					<-sem
				}()
			default:
				walk(s.fd, s.rel)
			}
		}
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening directory %s: %w", root, err)
	}
	walk(fd, "")
	wg.Wait()
	if len(errs) > 0 {
		return nil, errs[0]
	}
	sort.Slice(m, func(i, j int) bool { return m[i].Path < m[j].Path })
	return m, nil
}

const manifestMagic = "propio-sandbox manifest 1\n"

// writeManifest stores m compactly (about 40 bytes and a path per entry).
func writeManifest(file string, m manifest) error {
	var buf []byte
	buf = append(buf, manifestMagic...)
	buf = binary.AppendUvarint(buf, uint64(len(m)))
	for _, e := range m {
		buf = binary.AppendUvarint(buf, uint64(len(e.Path)))
		buf = append(buf, e.Path...)
		buf = binary.AppendUvarint(buf, uint64(len(e.Type)))
		buf = append(buf, e.Type...)
		buf = binary.AppendUvarint(buf, uint64(e.Mode))
		buf = binary.AppendVarint(buf, e.Size)
		buf = binary.AppendVarint(buf, e.Mtime)
		buf = binary.AppendUvarint(buf, uint64(len(e.Target)))
		buf = append(buf, e.Target...)
	}
	if err := os.WriteFile(file, buf, 0o600); err != nil {
		return fmt.Errorf("writing the base manifest: %w", err)
	}
	return nil
}

// readManifest loads what writeManifest stored.
func readManifest(file string) (manifest, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("reading the base manifest: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<16)
	bad := func(err error) (manifest, error) {
		return nil, fmt.Errorf("reading the base manifest %s: %w", file, err)
	}
	magic := make([]byte, len(manifestMagic))
	if _, err := io.ReadFull(r, magic); err != nil || string(magic) != manifestMagic {
		return bad(errors.New("not a manifest"))
	}
	str := func() (string, error) {
		n, err := binary.ReadUvarint(r)
		if err != nil {
			return "", err
		}
		if n > 1<<20 {
			return "", errors.New("corrupt manifest")
		}
		b := make([]byte, n)
		_, err = io.ReadFull(r, b)
		return string(b), err
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return bad(err)
	}
	m := make(manifest, 0, min(n, 1<<22))
	for range n {
		var e Entry
		var mode uint64
		var t string
		if e.Path, err = str(); err != nil {
			return bad(err)
		}
		if t, err = str(); err != nil {
			return bad(err)
		}
		e.Type = Type(t)
		if mode, err = binary.ReadUvarint(r); err != nil {
			return bad(err)
		}
		e.Mode = fs.FileMode(mode)
		if e.Size, err = binary.ReadVarint(r); err != nil {
			return bad(err)
		}
		if e.Mtime, err = binary.ReadVarint(r); err != nil {
			return bad(err)
		}
		if e.Target, err = str(); err != nil {
			return bad(err)
		}
		m = append(m, e)
	}
	if !sort.SliceIsSorted(m, func(i, j int) bool { return m[i].Path < m[j].Path }) {
		return bad(errors.New("entries out of order"))
	}
	return m, nil
}

// parentOf is the parent directory of a slash-separated relative path ("" at the top).
func parentOf(p string) string {
	d := path.Dir(p)
	if d == "." {
		return ""
	}
	return d
}
