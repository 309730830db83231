//go:build !linux

package netfence

import (
	"errors"
	"net/netip"
)

var errLinux = errors.New("a network namespace is fenced only on Linux")

// Fence is Linux's only.
func Fence(netip.Addr, netip.Prefix) error { return errLinux }

// Check is Linux's only.
func Check() error { return errLinux }
