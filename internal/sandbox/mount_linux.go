package sandbox

import "golang.org/x/sys/unix"

// kernelFSTypes are the file systems that are the kernel's view of the
// host rather than files, by their statfs(2) magic.
var kernelFSTypes = map[int64]string{
	unix.PROC_SUPER_MAGIC:    "proc",
	unix.SYSFS_MAGIC:         "sysfs",
	unix.DEVPTS_SUPER_MAGIC:  "devpts",
	unix.DEBUGFS_MAGIC:       "debugfs",
	unix.TRACEFS_MAGIC:       "tracefs",
	unix.SECURITYFS_MAGIC:    "securityfs",
	unix.CGROUP_SUPER_MAGIC:  "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2",
	unix.BPF_FS_MAGIC:        "bpf",
	unix.EFIVARFS_MAGIC:      "efivarfs",
	unix.PSTOREFS_MAGIC:      "pstore",
	unix.BINFMTFS_MAGIC:      "binfmt_misc",
}

// kernelFS names the file system of path when it is one of
// kernelFSTypes (mounted anywhere), else "".
func kernelFS(path string) string {
	var st unix.Statfs_t
	if unix.Statfs(path, &st) != nil {
		return ""
	}
	return kernelFSTypes[int64(st.Type)]
}
