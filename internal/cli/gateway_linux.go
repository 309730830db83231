package cli

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// keepNetAdmin has the process started with attr keep CAP_NET_ADMIN, as an
// ambient capability, across its change of user and its exec.
func keepNetAdmin(attr *syscall.SysProcAttr) {
	attr.AmbientCaps = []uintptr{unix.CAP_NET_ADMIN}
}
