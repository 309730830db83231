package diskcap

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Used is the space in use on the file system that holds path, in bytes.
func Used(path string) (int64, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return 0, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	size := s.Frsize
	if size == 0 {
		size = s.Bsize
	}
	return int64(s.Blocks-s.Bfree) * size, nil
}

// FSType names the type of the file system that holds path.
func FSType(path string) string {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return "its file system"
	}
	switch s.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	case unix.FUSE_SUPER_MAGIC:
		return "fuse"
	case 0x2fc12fc1:
		return "zfs"
	}
	return fmt.Sprintf("a file system of type %#x", s.Type)
}

// lowPriority runs f on an OS thread of its own at nice 19, which ends with
// it (a goroutine that exits locked to its thread takes the thread with it,
// so no other goroutine ever runs at that priority).
func lowPriority(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		// Best effort: at worst the walk runs at the launcher's priority.
		unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
		f()
	}()
	<-done
}
