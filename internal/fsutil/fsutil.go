// Package fsutil holds the file writing that must never leave a file
// half-written, and the reading of files a sandbox could have made, which
// must never block (OpenRegular), and unix sockets at paths too long for a
// socket address (DialUnix, ListenUnix).
package fsutil

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// WriteFileAtomic writes data to a temporary file beside path and renames it
// into place, so that path is never left half-written.
func WriteFileAtomic(path string, data []byte, perm fs.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	name := tmp.Name()
	fail := func(err error) error {
		tmp.Close()
		os.Remove(name)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fail(err)
	}
	if err := os.Rename(name, path); err != nil {
		os.Remove(name)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// WriteFileIfChanged makes path hold data: it writes nothing when it does
// already, else creates its directory (0755) and writes it atomically. For
// the small files a launch mounts (resolv.conf, account files), which are
// the same from one launch to the next.
func WriteFileIfChanged(path string, data []byte, perm fs.FileMode) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(path), err)
	}
	return WriteFileAtomic(path, data, perm)
}

// Rel returns path relative to dir, with forward slashes, and whether path
// is dir or below it ("." for dir itself). Both are taken as written: no
// link is resolved.
func Rel(dir, path string) (string, bool) {
	rel, err := filepath.Rel(dir, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", false
	}
	return filepath.ToSlash(rel), true
}

// Within reports whether path is dir or below it (see Rel).
func Within(dir, path string) bool {
	_, ok := Rel(dir, path)
	return ok
}

// WriteNew creates the file path, which must not exist (a link there is
// not followed), mode 0600, with what r holds, and closes it.
func WriteNew(path string, r io.Reader) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
