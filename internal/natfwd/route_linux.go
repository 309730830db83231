package natfwd

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// rtmsgLen is the size of struct rtmsg.
const rtmsgLen = 12

// AddLocalRoute makes every address of p local to the calling thread's
// network namespace, as `ip route replace local P dev lo table local` does:
// the kernel then answers ARP for them on any interface and accepts packets
// to them. p must be IPv4. It is idempotent (the route is created or
// replaced). It needs CAP_NET_ADMIN.
func AddLocalRoute(p netip.Prefix) error {
	if !p.IsValid() || !p.Addr().Is4() {
		return fmt.Errorf("natfwd: local route %v: not an IPv4 prefix", p)
	}
	p = p.Masked()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return fmt.Errorf("natfwd: local route %v: %w", p, err)
	}
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return fmt.Errorf("natfwd: local route %v: %w", p, err)
	}
	defer c.Close()

	rtm := [rtmsgLen]byte{
		0: unix.AF_INET,        // rtm_family
		1: byte(p.Bits()),      // rtm_dst_len
		4: unix.RT_TABLE_LOCAL, // rtm_table
		5: unix.RTPROT_BOOT,    // rtm_protocol
		6: unix.RT_SCOPE_HOST,  // rtm_scope
		7: unix.RTN_LOCAL,      // rtm_type
	}
	ae := netlink.NewAttributeEncoder()
	dst := p.Addr().As4()
	ae.Bytes(unix.RTA_DST, dst[:])
	ae.Uint32(unix.RTA_OIF, uint32(lo.Index))
	ae.Uint32(unix.RTA_TABLE, unix.RT_TABLE_LOCAL)
	attrs, err := ae.Encode()
	if err != nil {
		return fmt.Errorf("natfwd: local route %v: %w", p, err)
	}
	_, err = c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  unix.RTM_NEWROUTE,
			Flags: netlink.Request | netlink.Acknowledge | netlink.Create | netlink.Replace,
		},
		Data: append(rtm[:], attrs...),
	})
	if err != nil {
		return fmt.Errorf("natfwd: local route %v: %w", p, err)
	}
	return nil
}
