//go:build !linux

package diskcap

import (
	"os"

	"golang.org/x/sys/unix"
)

// Used is the space in use on the file system that holds path, in bytes.
func Used(path string) (int64, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return 0, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	return int64(s.Blocks-s.Bfree) * int64(s.Bsize), nil
}

// FSType names the type of the file system that holds path.
func FSType(path string) string {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return "its file system"
	}
	return unix.ByteSliceToString(s.Fstypename[:])
}

// lowPriority runs f.
func lowPriority(f func()) { f() }
