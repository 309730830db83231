package netfence

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// loopbackIndex is the interface index of lo in every network namespace.
const loopbackIndex = 1

// Fence installs the fence in the current network namespace: packets out
// go only to loopback, to gateway and to the gateway's virtual addresses
// (virtual, when valid: those its kernel forwards), on any protocol and
// port (what the gateway serves decides); packets in come only from them;
// everything else, IPv6 to anything but loopback included, is dropped.
// Installed in one transaction: the namespace is fenced in full or not at
// all.
func Fence(gateway netip.Addr, virtual netip.Prefix) error {
	if !gateway.Is4() || virtual.IsValid() && !virtual.Addr().Is4() {
		return fmt.Errorf("fencing to %s and %s: want IPv4 addresses", gateway, virtual)
	}
	to := []netip.Prefix{netip.PrefixFrom(gateway, 32)}
	if virtual.IsValid() {
		to = append(to, virtual.Masked())
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("fencing the network namespace: %w", err)
	}
	t := c.AddTable(&nftables.Table{Name: TableName, Family: nftables.TableFamilyINet})
	drop := nftables.ChainPolicyDrop
	out := c.AddChain(&nftables.Chain{Name: "out", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	in := c.AddChain(&nftables.Chain{Name: "in", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: append(metaIs(expr.MetaKeyOIF, loopbackIndex), accept)})
	for _, p := range to {
		c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: append(addrIn(16, p), accept)})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: append(metaIs(expr.MetaKeyIIF, loopbackIndex), accept)})
	for _, p := range to {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: append(addrIn(12, p), accept)})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("fencing the network namespace: %w", err)
	}
	return nil
}

// Check says whether the current network namespace is fenced (as Fence
// does): nil when it is, ErrNotFenced when it has no fence, another error
// when it cannot tell.
func Check() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("reading the network namespace's firewall: %w", err)
	}
	t, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if err != nil {
		return ErrNotFenced
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("reading the network namespace's firewall: %w", err)
	}
	found := 0
	for _, ch := range chains {
		if ch.Table.Name != t.Name || ch.Policy == nil || *ch.Policy != nftables.ChainPolicyDrop {
			continue
		}
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return fmt.Errorf("reading the network namespace's firewall: %w", err)
		}
		if len(rules) >= 2 {
			found++
		}
	}
	if found != 2 {
		return ErrNotFenced
	}
	return nil
}

// metaIs matches an interface index (iif, oif).
func metaIs(key expr.MetaKey, index uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, index)},
	}
}

// addrIn matches IPv4 packets whose address at offset (12: source, 16:
// destination) of the IPv4 header is in p.
func addrIn(offset uint32, p netip.Prefix) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net.CIDRMask(p.Bits(), 32), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}
