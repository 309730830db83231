//go:build !linux

package gatewayd

import "syscall"

// keepNetAdmin does nothing: the gateway forwards in the kernel on Linux only.
func keepNetAdmin(*syscall.SysProcAttr) {}

// dropCapabilities does nothing: capabilities are Linux's.
func dropCapabilities(bool) error { return nil }
