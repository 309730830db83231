package natfwd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// tableName is the nftables table a Forwarder owns.
const tableName = "propio_sandbox_gateway"

// Forwarder forwards connections to virtual addresses in the kernel of the
// network namespace it was made in: the gateway's. It implements
// gateway.Kernel.
//
// Its ruleset, in nft terms:
//
//	table ip propio_sandbox_gateway {
//	  chain pre {  type nat hook prerouting priority dstnat - 10
//	    ip daddr VIRTUAL jump virtual
//	    ip daddr VIRTUAL meta l4proto tcp redirect to :CATCH }
//	  chain virtual { ip daddr V1 jump v1 ... }        # one per address in use
//	  chain v1 { tcp dport 443 dnat to UPSTREAM ...      # replaced as the name moves
//	    meta l4proto tcp redirect to :REFUSE }         # no listener there: refused
//	  chain post { type nat hook postrouting priority srcnat
//	    ct status dnat masquerade }
//	  chain forward { type filter hook forward priority filter; policy drop
//	    ct state established,related accept
//	    ct status dnat accept }
//	}
//
// So the only packets the namespace forwards are those of connections it
// translated itself, to an upstream the gateway chose. A connection to a
// name's virtual address on a port not forwarded goes to REFUSE, where
// nothing listens: the kernel answers its SYN with a reset, as a closed port
// does, and the client fails at once (ECONNREFUSED); its conntrack entry
// says where it was going. Everything else sent to a virtual address comes
// to the catch listener, and the rest is dropped.
type Forwarder struct {
	mu      sync.Mutex
	conn    *nftables.Conn
	table   *nftables.Table
	virtual *nftables.Chain
	chains  map[netip.Addr]*nftables.Chain
	refuse  uint16
}

// Setup makes the addresses of virtual local to this network namespace (so
// the kernel answers ARP for them on the sandbox network) and installs the
// Forwarder's ruleset, replacing one a previous gateway left. Connections
// to a virtual address that nothing forwards are redirected to catchPort on
// the address they arrived at; those to a forwarded address on a port it
// does not forward, to refusePort there, where nothing may listen. IP
// forwarding must be on (net.ipv4.ip_forward=1). It needs CAP_NET_ADMIN.
func Setup(virtual netip.Prefix, catchPort, refusePort uint16) (*Forwarder, error) {
	if !virtual.IsValid() || !virtual.Addr().Is4() {
		return nil, fmt.Errorf("kernel forwarding: %v is not an IPv4 prefix", virtual)
	}
	virtual = virtual.Masked()
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err != nil || strings.TrimSpace(string(b)) != "1" {
		return nil, errors.New("kernel forwarding: net.ipv4.ip_forward is not 1 in this network namespace")
	}
	if err := AddLocalRoute(virtual); err != nil {
		return nil, fmt.Errorf("kernel forwarding: %w", err)
	}
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("kernel forwarding: nftables: %w", err)
	}
	f := &Forwarder{conn: c, chains: map[netip.Addr]*nftables.Chain{}, refuse: refusePort}
	f.table = &nftables.Table{Name: tableName, Family: nftables.TableFamilyIPv4}
	// Adding then deleting the table removes one left behind, whatever it holds.
	c.AddTable(f.table)
	c.DelTable(f.table)
	c.AddTable(f.table)

	dstnat := *nftables.ChainPriorityNATDest - 10
	pre := c.AddChain(&nftables.Chain{Name: "pre", Table: f.table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: &dstnat})
	f.virtual = c.AddChain(&nftables.Chain{Name: "virtual", Table: f.table})
	post := c.AddChain(&nftables.Chain{Name: "post", Table: f.table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	drop := nftables.ChainPolicyDrop
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: f.table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})

	c.AddRule(&nftables.Rule{Table: f.table, Chain: pre, Exprs: append(daddrIn(virtual),
		&expr.Verdict{Kind: expr.VerdictJump, Chain: f.virtual.Name})})
	c.AddRule(&nftables.Rule{Table: f.table, Chain: pre, Exprs: append(append(daddrIn(virtual), l4protoTCP()...),
		&expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, catchPort)},
		&expr.Redir{RegisterProtoMin: 1})})
	c.AddRule(&nftables.Rule{Table: f.table, Chain: post, Exprs: append(ctStatus(StatusDstNAT), &expr.Masq{})})
	c.AddRule(&nftables.Rule{Table: f.table, Chain: fwd, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: nativeUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: nativeUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: nativeUint32(0)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	c.AddRule(&nftables.Rule{Table: f.table, Chain: fwd, Exprs: append(ctStatus(StatusDstNAT), &expr.Verdict{Kind: expr.VerdictAccept})})
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("kernel forwarding: installing the ruleset: %w", err)
	}
	return f, nil
}

// Forward makes TCP connections to v on each of ports go to to on the same
// port, and those on any other port to the refuse port, replacing what v
// forwarded before, in one transaction.
func (f *Forwarder) Forward(v netip.Addr, ports []uint16, to netip.Addr) error {
	if !v.Is4() || !to.Is4() {
		return fmt.Errorf("kernel forwarding: %v to %v: IPv4 only", v, to)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ch, ok := f.chains[v]
	if !ok {
		ch = f.conn.AddChain(&nftables.Chain{Name: "v-" + strings.ReplaceAll(v.String(), ".", "-"), Table: f.table})
		f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: f.virtual, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: v.AsSlice()},
			&expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name},
		}})
	} else {
		f.conn.FlushChain(ch)
	}
	for _, p := range ports {
		f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: ch, Exprs: append(l4protoTCP(),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, p)},
			&expr.Immediate{Register: 1, Data: to.AsSlice()},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1},
		)})
	}
	f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: ch, Exprs: append(l4protoTCP(),
		&expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, f.refuse)},
		&expr.Redir{RegisterProtoMin: 1})})
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("kernel forwarding: %v to %v: %w", v, to, err)
	}
	f.chains[v] = ch
	return nil
}

// Original is where a connection redirected to the catch listener was
// going (SO_ORIGINAL_DST).
func (f *Forwarder) Original(conn net.Conn) (netip.AddrPort, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a socket")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa unix.RawSockaddrInet4
	var serr error
	err = raw.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(sa))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IP, unix.SO_ORIGINAL_DST,
			uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			serr = errno
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("the original destination: %w", err)
	}
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port), nil
}

// daddrIn matches an IPv4 destination in p.
func daddrIn(p netip.Prefix) []expr.Any {
	mask := net.CIDRMask(p.Bits(), 32)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Addr().AsSlice()},
	}
}

func l4protoTCP() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
	}
}

// ctStatus matches connections with a conntrack status bit.
func ctStatus(bit uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: nativeUint32(bit), Xor: nativeUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: nativeUint32(0)},
	}
}

// nativeUint32 is v as the kernel holds ct state and status: host order.
func nativeUint32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
