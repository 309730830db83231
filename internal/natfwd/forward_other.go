//go:build !linux

package natfwd

import (
	"net"
	"net/netip"
)

// Forwarder forwards connections in the kernel; only on Linux.
type Forwarder struct{}

// Setup fails: kernel forwarding needs Linux.
func Setup(netip.Prefix, uint16, uint16) (*Forwarder, error) { return nil, errNotLinux }

// Forward fails: kernel forwarding needs Linux.
func (f *Forwarder) Forward(netip.Addr, []uint16, netip.Addr) error { return errNotLinux }

// Original fails: kernel forwarding needs Linux.
func (f *Forwarder) Original(net.Conn) (netip.AddrPort, error) { return netip.AddrPort{}, errNotLinux }
