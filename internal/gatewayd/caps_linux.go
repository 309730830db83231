package gatewayd

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// keepNetAdmin has the process started with attr keep CAP_NET_ADMIN, as an
// ambient capability, across its change of user and its exec.
func keepNetAdmin(attr *syscall.SysProcAttr) {
	attr.AmbientCaps = []uintptr{unix.CAP_NET_ADMIN}
}

// dropCapabilities leaves every thread of this process with CAP_NET_ADMIN
// as its only capability when netAdmin is set, else with none: the gateway
// of a launcher that runs as root stays root, without what it started with
// to change users.
func dropCapabilities(netAdmin bool) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if netAdmin {
		data[0].Effective = 1 << unix.CAP_NET_ADMIN
		data[0].Permitted = 1 << unix.CAP_NET_ADMIN
	}
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if errno != 0 {
		return fmt.Errorf("dropping capabilities: %w", errno)
	}
	return nil
}
