// Package gitindex reads which paths a git repository tracks from its index
// file (.git/index), by itself: it never runs git, whose configuration in a
// workspace that a sandbox has written to could make it run anything. It
// reads index versions 2, 3 and 4, with SHA-1 or SHA-256 object names; it
// refuses a split or sparse index, which do not list every path.
package gitindex

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/propio/propio-sandbox/internal/fsutil"
)

// ErrNoRepository: the directory has no .git of its own.
var ErrNoRepository = errors.New("no git repository")

// ErrUnsupported: an index this package cannot list every path of (a split
// or sparse index); its error says which.
var ErrUnsupported = errors.New("unsupported index")

// MaxSize is the largest index file read (an index of a million paths is
// about 100 MB).
const MaxSize = 1 << 30

// Tracked returns the paths the index of the repository whose work tree is
// dir lists (relative to dir, with forward slashes, sorted, each once).
// dir/.git is the repository's directory, or a gitfile (`gitdir: PATH`)
// naming it, as for a linked worktree or a submodule; the object format
// comes from the repository's config (extensions.objectformat), that of a
// worktree's main repository (commondir) first. ErrNoRepository when dir
// has no .git.
func Tracked(dir string) ([]string, error) {
	gitdir, err := findGitDir(dir)
	if err != nil {
		return nil, err
	}
	hashSize, err := objectFormat(gitdir)
	if err != nil {
		return nil, err
	}
	return ReadFile(filepath.Join(gitdir, "index"), hashSize)
}

// findGitDir returns the repository directory of the work tree dir.
func findGitDir(dir string) (string, error) {
	dotgit := filepath.Join(dir, ".git")
	fi, err := os.Lstat(dotgit)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", ErrNoRepository
	case err != nil:
		return "", err
	case fi.IsDir():
		return dotgit, nil
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("%s is neither a directory nor a gitfile (%s)", dotgit, fsutil.Kind(fi.Mode()))
	}
	data, err := fsutil.ReadRegular(dotgit, 4096)
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	gitdir, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "gitdir: ")
	if !ok || gitdir == "" {
		return "", fmt.Errorf("%s is a file but not a gitfile (no gitdir: line)", dotgit)
	}
	if !filepath.IsAbs(gitdir) {
		gitdir = filepath.Join(dir, gitdir)
	}
	return gitdir, nil
}

// objectFormat returns the size of the repository's object names: 32 when
// its config (or its main repository's, for a linked worktree) sets
// extensions.objectformat to sha256, else 20.
func objectFormat(gitdir string) (int, error) {
	dirs := []string{gitdir}
	if data, err := fsutil.ReadRegular(filepath.Join(gitdir, "commondir"), 4096); err == nil {
		common := strings.TrimSpace(string(data))
		if !filepath.IsAbs(common) {
			common = filepath.Join(gitdir, common)
		}
		dirs = []string{common, gitdir}
	}
	for _, d := range dirs {
		data, err := fsutil.ReadRegular(filepath.Join(d, "config"), 1<<20)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		switch f := configValue(data, "extensions", "objectformat"); strings.ToLower(f) {
		case "", "sha1":
			return sha1.Size, nil
		case "sha256":
			return sha256.Size, nil
		default:
			return 0, fmt.Errorf("%s: unknown extensions.objectformat %q", filepath.Join(d, "config"), f)
		}
	}
	return sha1.Size, nil
}

// configValue returns the last value of section.key in a git config file,
// read as simply as this needs: no includes, no subsections, no
// continuation lines; section and key names compare case-insensitively.
func configValue(data []byte, section, key string) string {
	var in bool
	var value string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "["), "]")
			in = strings.EqualFold(strings.TrimSpace(name), section)
			continue
		}
		if !in {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		if strings.EqualFold(strings.TrimSpace(k), key) {
			v, _, _ = strings.Cut(v, "#")
			v, _, _ = strings.Cut(v, ";")
			value = strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return value
}

// ReadFile returns the paths the index file name lists (see Parse). It
// refuses, at once, a file that is not a regular one (a FIFO would
// otherwise block the reader), or is larger than MaxSize.
func ReadFile(name string, hashSize int) ([]string, error) {
	data, err := fsutil.ReadRegular(name, MaxSize)
	if err != nil {
		return nil, err
	}
	paths, err := Parse(data, hashSize)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	return paths, nil
}

// Parse returns the paths an index lists, sorted, each once (the stages of
// a conflict are one path), with forward slashes as git writes them.
// hashSize is the size of the repository's object names: 20 (SHA-1) or 32
// (SHA-256). The trailing checksum is verified unless it is all zeros
// (index.skipHash). A split index (extension link) or a sparse one
// (extension sdir, or directory entries) is ErrUnsupported.
func Parse(data []byte, hashSize int) ([]string, error) {
	if hashSize != sha1.Size && hashSize != sha256.Size {
		return nil, fmt.Errorf("object names of %d bytes: want 20 or 32", hashSize)
	}
	if len(data) < 12+hashSize || string(data[:4]) != "DIRC" {
		return nil, errors.New("not a git index (no DIRC header)")
	}
	version := binary.BigEndian.Uint32(data[4:8])
	if version < 2 || version > 4 {
		return nil, fmt.Errorf("index version %d: only 2, 3 and 4 are known", version)
	}
	body, sum := data[:len(data)-hashSize], data[len(data)-hashSize:]
	if !allZero(sum) {
		var h hash.Hash = sha1.New()
		if hashSize == sha256.Size {
			h = sha256.New()
		}
		h.Write(body)
		if !bytes.Equal(h.Sum(nil), sum) {
			return nil, errors.New("checksum mismatch (a damaged index, or a repository of another object format)")
		}
	}
	count := binary.BigEndian.Uint32(data[8:12])
	// An entry: ctime, mtime (8 each), dev, ino, mode, uid, gid, size (4
	// each), the object name, 16 bits of flags, 16 more in version 3 and
	// up when the extended flag is set, then the path.
	fixed := 40 + hashSize + 2
	off := 12
	seen := map[string]bool{}
	var paths []string
	var prev []byte
	empty := false
	for i := uint32(0); i < count; i++ {
		bad := func(why string) error { return fmt.Errorf("entry %d of %d at offset %d: %s", i+1, count, off, why) }
		if off+fixed > len(body) {
			return nil, bad("truncated")
		}
		mode := binary.BigEndian.Uint32(data[off+24 : off+28])
		flags := binary.BigEndian.Uint16(data[off+40+hashSize:])
		p := off + fixed
		if flags&0x4000 != 0 {
			if version < 3 {
				return nil, bad("extended flags in a version 2 index")
			}
			p += 2
		}
		if p > len(body) {
			return nil, bad("truncated")
		}
		var name []byte
		if version == 4 {
			// The number of bytes to drop from the end of the previous
			// path, then the rest of this one, NUL-terminated.
			strip, n := varint(body[p:])
			if n == 0 || strip > uint64(len(prev)) {
				return nil, bad("bad path prefix")
			}
			p += n
			end := bytes.IndexByte(body[p:], 0)
			if end < 0 {
				return nil, bad("path not terminated")
			}
			name = append(prev[:len(prev)-int(strip):len(prev)-int(strip)], body[p:p+end]...)
			off = p + end + 1
		} else {
			end := bytes.IndexByte(body[p:], 0)
			if end < 0 {
				return nil, bad("path not terminated")
			}
			name = body[p : p+end]
			// NUL padding to a multiple of 8 bytes, at least one.
			off += (p - off + end + 8) &^ 7
		}
		if mode&0o170000 == 0o040000 {
			return nil, fmt.Errorf("%w: a sparse index (index.sparse), which lists directories (%q) for the paths outside the sparse checkout", ErrUnsupported, name)
		}
		if len(name) == 0 {
			// In a split index, an entry that replaces one of the shared
			// index's: refused below, with the extension.
			empty = true
		} else if s := string(name); !seen[s] {
			seen[s] = true
			paths = append(paths, s)
		}
		prev = name
	}
	// The extensions: a signature, a size, the data.
	for off+8 <= len(body) {
		sig := string(data[off : off+4])
		size := binary.BigEndian.Uint32(data[off+4 : off+8])
		switch sig {
		case "link":
			return nil, fmt.Errorf("%w: a split index (core.splitIndex), which lists some paths in another file", ErrUnsupported)
		case "sdir":
			return nil, fmt.Errorf("%w: a sparse index (index.sparse), which lists directories for the paths outside the sparse checkout", ErrUnsupported)
		}
		if uint64(off)+8+uint64(size) > uint64(len(body)) {
			return nil, fmt.Errorf("extension %q at offset %d: truncated", sig, off)
		}
		off += 8 + int(size)
	}
	if off != len(body) {
		return nil, fmt.Errorf("%d stray bytes before the checksum", len(body)-off)
	}
	if empty {
		return nil, errors.New("an entry with an empty path")
	}
	sort.Strings(paths)
	return paths, nil
}

// varint decodes git's offset varint (each continuation adds one before
// shifting), returning the value and the bytes read, 0 when malformed.
func varint(b []byte) (uint64, int) {
	if len(b) == 0 {
		return 0, 0
	}
	c := b[0]
	v := uint64(c & 0x7f)
	n := 1
	for c&0x80 != 0 {
		if n >= len(b) || n > 9 {
			return 0, 0
		}
		c = b[n]
		n++
		v = (v+1)<<7 | uint64(c&0x7f)
	}
	return v, n
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
