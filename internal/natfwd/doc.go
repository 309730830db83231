// Package natfwd is the kernel forwarding side of the egress gateway: small
// netlink helpers used in the gateway's own network namespace. WatchConntrack
// (or a Watcher) reports the conntrack NEW and DESTROY events of IPv4 TCP and
// UDP connections, with their original and NATed addresses and byte counters;
// AddLocalRoute makes a prefix local to the namespace, so that the kernel
// answers ARP for its addresses and accepts packets to them.
//
// Everything here works on the network namespace of the calling thread and
// needs CAP_NET_ADMIN there. The package never prints: failures are returned
// as errors and overruns are counted.
package natfwd

// StatusDstNAT is the ConnEvent.Status bit IPS_DST_NAT of
// linux/netfilter/nf_conntrack_common.h: the connection's destination was
// translated (the gateway's kernel forwarded it).
const StatusDstNAT = 1 << 5

// ProtoTCP is ConnEvent.Proto of a TCP connection.
const ProtoTCP = 6
