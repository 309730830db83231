package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
)

// The kernel path. Relaying every byte through the gateway's own process
// costs two TCP terminations per connection, which on a small machine halves
// what one stream can carry. With a Kernel, the DNS answers an allowed name
// with a virtual address of its own, taken from Config.Virtual, and has the
// kernel of the gateway's network namespace forward (DNAT) connections to it,
// on the ports the policy allows for that name, to the address the name
// resolved to upstream. A connection to a name's virtual address on another
// port is refused by the kernel, as a closed port is (a reset to its SYN:
// the client sees ECONNREFUSED at once, where an accepted-then-reset
// connection left Node's fetch hanging), and logged from its connection
// tracking (LogRefused). Everything else sent to a virtual address (one no
// name has) is redirected to the gateway's catch listener, which logs it as
// denied and resets it. The user-space listeners stay for the proxies, for a name whose
// upstream the kernel cannot take (no IPv4 address, lookup failed), and for a
// gateway that runs without a Kernel.

// Kernel forwards connections in the kernel.
type Kernel interface {
	// Forward makes TCP connections to v on each of ports go to upstream to
	// on the same port, and refuses those on any other port as a closed port
	// does, replacing whatever v forwarded before.
	Forward(v netip.Addr, ports []uint16, to netip.Addr) error
	// Original is where a connection the kernel redirected to the catch
	// listener was going.
	Original(conn net.Conn) (netip.AddrPort, error)
}

// Conn is a connection the kernel forwarded, as its connection tracking
// reports it once it has ended.
type Conn struct {
	Start     time.Time
	Client    netip.AddrPort // the sandbox side
	Dst       netip.AddrPort // the virtual address and port the client dialled
	Upstream  netip.AddrPort // where the kernel sent it
	BytesUp   int64
	BytesDown int64
}

// virtualTable maps names to virtual addresses, reusing the least recently
// answered address when all are taken.
type virtualTable struct {
	mu     sync.Mutex
	free   []netip.Addr
	byName map[string]*virtualAddr
	byAddr map[netip.Addr]*virtualAddr
}

type virtualAddr struct {
	addr     netip.Addr
	name     string
	upstream netip.Addr
	ports    []uint16
	used     time.Time
}

// newVirtualTable takes every address of p but its first and last (a /24's
// network and broadcast addresses may fall in it).
func newVirtualTable(p netip.Prefix) *virtualTable {
	t := &virtualTable{byName: map[string]*virtualAddr{}, byAddr: map[netip.Addr]*virtualAddr{}}
	if !p.IsValid() || !p.Addr().Is4() || p.Bits() > 30 {
		return t
	}
	p = p.Masked()
	for a := p.Addr().Next(); p.Contains(a.Next()); a = a.Next() {
		t.free = append(t.free, a)
	}
	return t
}

// name is the name a virtual address was last given to; a nil table (no
// kernel forwarding) has none.
func (t *virtualTable) name(a netip.Addr) (string, bool) {
	if t == nil {
		return "", false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.byAddr[a.Unmap()]
	if !ok {
		return "", false
	}
	return v.name, true
}

// virtualAnswer is the address DNS answers an allowed name with when the
// kernel forwards it: its virtual address, forwarding to what the name
// resolves to upstream. ok is false when the name must go through the
// user-space listeners instead (the gateway's own address answers it then);
// a refusedError says the name resolves to an address no rule can allow, a
// lookupError that it could not be resolved.
func (c *Config) virtualAnswer(ctx context.Context, name string) (netip.Addr, bool, error) {
	if c.Kernel == nil || c.virtual == nil {
		return netip.Addr{}, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, dnsLookupTimeout)
	defer cancel()
	addrs, err := c.resolve(ctx, name)
	if err != nil {
		return netip.Addr{}, false, &lookupError{fmt.Errorf("resolving %s: %w", name, err)}
	}
	if len(addrs) == 0 {
		return netip.Addr{}, false, nil // the user-space path says why, per connection
	}
	var up netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if why := c.refuses(a); why != "" {
			return netip.Addr{}, false, &refusedError{host: name, addr: a, reason: why}
		}
		if !up.IsValid() && a.Is4() {
			up = a
		}
	}
	ports := c.allowedPorts(name)
	if !up.IsValid() || len(ports) == 0 || c.interceptsName(name, ports) {
		// The gateway's own address: its listeners decide, and open
		// what they must see (a secret's host, limited requests).
		return netip.Addr{}, false, nil
	}
	t := c.virtual
	t.mu.Lock()
	defer t.mu.Unlock()
	v := t.byName[name]
	if v == nil {
		if len(t.free) > 0 {
			v = &virtualAddr{addr: t.free[0]}
			t.free = t.free[1:]
		} else if len(t.byAddr) > 0 { // the least recently answered
			for _, o := range t.byAddr {
				if v == nil || o.used.Before(v.used) {
					v = o
				}
			}
			delete(t.byName, v.name)
		} else {
			return netip.Addr{}, false, nil
		}
		v.name, v.upstream, v.ports = name, netip.Addr{}, nil
		t.byName[name], t.byAddr[v.addr] = v, v
	}
	v.used = c.now()
	if v.upstream != up || !slices.Equal(v.ports, ports) {
		if err := c.Kernel.Forward(v.addr, ports, up); err != nil {
			// Forget the mapping: the kernel's state is unknown, and the
			// user-space path serves the name. The address is free again
			// (the next Forward of it replaces whatever it forwards).
			delete(t.byName, name)
			delete(t.byAddr, v.addr)
			t.free = append(t.free, v.addr)
			return netip.Addr{}, false, nil
		}
		v.upstream, v.ports = up, ports
	}
	return v.addr, true, nil
}

// notFound reports whether the name does not exist (rather than the lookup
// failing for now).
func (e *lookupError) notFound() bool {
	var dnsErr *net.DNSError
	return errors.As(e.err, &dnsErr) && dnsErr.IsNotFound
}

// allowedPorts are the ports the policy allows name on: 80 and 443 by a rule
// without a port, and each port a rule names.
func (c *Config) allowedPorts(name string) []uint16 {
	var ports []uint16
	for _, p := range namePorts(c.Policy) {
		if !slices.Contains(ports, p) && c.allowsForRun(name, p) {
			ports = append(ports, p)
		}
	}
	slices.Sort(ports)
	return ports
}

// decideNAT decides a connection the kernel saw again, for its log entry:
// by the name its virtual address stands for, at the time it began.
func (c *Config) decideNAT(k Conn) decisionlog.Entry {
	name, ok := c.virtual.name(k.Dst.Addr())
	if !ok {
		name = k.Dst.Addr().String()
	}
	e := c.decide(net.TCPAddrFromAddrPort(k.Client), "nat", name, k.Dst.Port())
	if !k.Start.IsZero() {
		e.Time = k.Start.UTC()
	}
	return e
}

// LogForwarded logs a connection the kernel forwarded: the name its virtual
// address stood for, decided again (it was allowed when it was set up).
func (c *Config) LogForwarded(k Conn) {
	e := c.decideNAT(k)
	e.BytesUp, e.BytesDown = k.BytesUp, k.BytesDown
	if !e.Allowed {
		// Forwarded, yet not allowed now: the name's virtual address was
		// given to another name while this connection lasted.
		e.Error = "forwarded by the kernel to " + k.Upstream.String()
	}
	c.record(e)
}

// LogRefused logs a connection the kernel refused: one to a virtual address
// on a port the policy does not allow for its name.
func (c *Config) LogRefused(k Conn) {
	e := c.decideNAT(k)
	if e.Allowed {
		// The name's ports changed as it connected.
		e.Allowed, e.Rule, e.Reason = false, "", "refused by the kernel: port "+fmt.Sprint(k.Dst.Port())+" was not forwarded when it connected"
	}
	c.record(e)
}

// ServeCatch serves the catch listener: the kernel redirects to it every
// connection to a virtual address that stands for no name (the kernel
// refuses a name's other ports itself). Each is logged as denied, with the
// name and port the client dialled, and reset.
func (c *Config) ServeCatch(l net.Listener) error {
	return c.acceptEach(l, "nat", func(ctx context.Context, conn net.Conn) {
		dst, err := c.Kernel.Original(conn)
		if err != nil {
			c.resetRefused(conn, decisionlog.Entry{Via: "nat", Reason: "no destination", Error: err.Error()})
			return
		}
		name, ok := c.virtual.name(dst.Addr())
		if !ok {
			c.resetRefused(conn, decisionlog.Entry{Via: "nat", Host: dst.Addr().String(), Port: dst.Port(), Reason: "no name resolves to " + dst.Addr().String()})
			return
		}
		e := c.decide(conn.RemoteAddr(), "nat", name, dst.Port())
		if e.Allowed && c.intercepts(name, dst.Port()) {
			c.interceptPeeked(ctx, conn, &target{host: name, port: dst.Port(), via: "nat", decided: e}, e)
			return
		}
		if e.Allowed {
			// Allowed, but not forwarded: the mapping changed under the
			// connection. Carry it in user space.
			c.forwardAllowed(ctx, conn, conn, e)
			return
		}
		c.resetRefused(conn, e)
	})
}
