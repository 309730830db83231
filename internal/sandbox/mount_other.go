//go:build !linux

package sandbox

// kernelFS names the file system of path when it is the kernel's view of
// the host; outside Linux, the paths of kernelDirs are all there is.
func kernelFS(string) string { return "" }
