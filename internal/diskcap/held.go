package diskcap

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Held sums, by file system (device number), the blocks of the files that
// the processes pids hold open, or mapped, after they were deleted: space a
// walk cannot see (`exec 3>f; rm f; cat /dev/zero >&3`). Only devices in
// devs count. What /proc does not let this process see (another user's
// processes, when it is not root) is left out.
func Held(pids []int, devs map[uint64]bool) map[uint64]int64 {
	out := map[uint64]int64{}
	seen := map[FileID]bool{}
	for _, pid := range pids {
		base := "/proc/" + strconv.Itoa(pid)
		for _, dir := range []string{base + "/fd", base + "/map_files"} {
			f, err := os.Open(dir)
			if err != nil {
				continue
			}
			names, _ := f.Readdirnames(-1)
			f.Close()
			for _, name := range names {
				var st unix.Stat_t
				// Stat follows the magic link to the open file itself.
				if unix.Stat(dir+"/"+name, &st) != nil || st.Nlink != 0 || st.Mode&unix.S_IFMT != unix.S_IFREG {
					continue
				}
				id := FileID{uint64(st.Dev), st.Ino}
				if !devs[id.Dev] || seen[id] {
					continue
				}
				seen[id] = true
				out[id.Dev] += st.Blocks * 512
			}
		}
	}
	return out
}

// Dev is the device number of the file system that holds path (not
// following a final link).
func Dev(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return 0, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	return uint64(st.Dev), nil
}
