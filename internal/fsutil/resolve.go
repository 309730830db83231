package fsutil

import (
	"os"
	"path/filepath"
	"strings"
)

// maxLinks bounds the links followed in one resolution, as the kernel's
// ELOOP does (40).
const maxLinks = 40

// Resolve returns the absolute path abs with every symbolic link resolved,
// as far as it exists, and whether all of it exists. A link is followed
// even when what it points to does not exist (so a dangling link names its
// target); the components after the first missing one are kept as they are.
// A link loop stops the resolution where it is.
func Resolve(abs string) (string, bool) {
	abs = filepath.Clean(abs)
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r, true
	}
	links := 0
	done := "/"
	rest := strings.Split(strings.TrimPrefix(abs, "/"), "/")
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		if name == "" || name == "." {
			continue
		}
		if name == ".." {
			done = filepath.Dir(done)
			continue
		}
		next := filepath.Join(done, name)
		st, err := os.Lstat(next)
		if err != nil {
			return filepath.Join(append([]string{next}, rest...)...), false
		}
		if st.Mode()&os.ModeSymlink == 0 {
			done = next
			continue
		}
		target, err := os.Readlink(next)
		links++
		if err != nil || links > maxLinks {
			return filepath.Join(append([]string{next}, rest...)...), false
		}
		if filepath.IsAbs(target) {
			done = "/"
		}
		rest = append(strings.Split(strings.TrimPrefix(target, "/"), "/"), rest...)
	}
	_, err := os.Stat(done)
	return done, err == nil
}

// SameFile reports whether two existing paths, links followed, are one
// file.
func SameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}
