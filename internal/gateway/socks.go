package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
)

// SOCKS5 (RFC 1928) constants the server uses.
const (
	socksVersion = 0x05

	socksNoAuth       = 0x00
	socksNoAcceptable = 0xff

	socksConnect = 0x01

	socksIPv4   = 0x01
	socksDomain = 0x03
	socksIPv6   = 0x04

	socksSucceeded          = 0x00
	socksGeneralFailure     = 0x01
	socksNotAllowed         = 0x02
	socksNetworkUnreachable = 0x03
	socksHostUnreachable    = 0x04
	socksConnectionRefused  = 0x05
	socksCommandUnsupported = 0x07
	socksAddressUnsupported = 0x08
)

// ServeSOCKS serves a SOCKS5 proxy on l: no authentication (the sandbox
// network is the boundary), CONNECT only, to IPv4, IPv6 and domain
// destinations. Every destination is decided by the policy; a denied one gets
// reply 0x02, "connection not allowed by ruleset", and a log entry that says
// why. ServeSOCKS returns nil once l is closed, after closing the connections
// it accepted.
func (c *Config) ServeSOCKS(l net.Listener) error {
	return c.serve(l, "socks5", handshakeTimeout, c.serveSOCKSConn)
}

// serveSOCKSConn serves one SOCKS5 connection.
func (c *Config) serveSOCKSConn(ctx context.Context, conn net.Conn, timeout time.Duration) {
	conn.SetDeadline(time.Now().Add(timeout))
	e := decisionlog.Entry{Time: c.now().UTC(), Client: conn.RemoteAddr().String(), Via: "socks5"}
	reject := func(reason string, err error) {
		e.Reason = reason
		if err != nil {
			e.Error = err.Error()
		}
		c.record(e)
	}

	// Method negotiation: VER NMETHODS METHODS...
	var hdr [2]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return // a client that said nothing (or went away) is not worth a log line
	}
	if hdr[0] != socksVersion {
		reject(fmt.Sprintf("not a SOCKS5 request (version %d)", hdr[0]), nil)
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(conn, methods); err != nil {
		reject("not a SOCKS5 request", err)
		return
	}
	if !slices.Contains(methods, socksNoAuth) {
		conn.Write([]byte{socksVersion, socksNoAcceptable})
		reject("the SOCKS5 client offers no method the gateway accepts (only no authentication)", nil)
		return
	}
	if _, err := conn.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return
	}

	// Request: VER CMD RSV ATYP DST.ADDR DST.PORT
	var req [4]byte
	if _, err := io.ReadFull(conn, req[:]); err != nil {
		reject("not a SOCKS5 request", err)
		return
	}
	if req[0] != socksVersion {
		reject(fmt.Sprintf("not a SOCKS5 request (version %d)", req[0]), nil)
		return
	}
	host, port, err := readSOCKSAddr(conn, req[3])
	if errors.Is(err, errAddressType) {
		conn.Write(socksReply(socksAddressUnsupported, nil))
		reject("SOCKS5 address type not supported", err)
		return
	}
	if err != nil {
		reject("not a SOCKS5 request", err)
		return
	}
	e.Host, e.Port = host, port
	if req[1] != socksConnect {
		conn.Write(socksReply(socksCommandUnsupported, nil))
		reject(fmt.Sprintf("SOCKS5 command %d is not supported (only CONNECT)", req[1]), nil)
		return
	}

	e = c.decideAsk(ctx, conn.RemoteAddr(), "socks5", host, port)
	conn.SetDeadline(time.Now().Add(timeout)) // it may have waited for an answer
	if e.Allowed && c.intercepts(host, port) {
		// Opened by the gateway: each request goes upstream on its own.
		if _, err := conn.Write(socksReply(socksSucceeded, nil)); err != nil {
			e.Error = err.Error()
			c.record(e)
			return
		}
		conn.SetDeadline(time.Time{})
		c.interceptPeeked(ctx, conn, &target{host: host, port: port, via: "socks5", decided: e}, e)
		return
	}
	up, code := c.openSOCKS(ctx, &e, timeout)
	if up == nil {
		conn.Write(socksReply(code, nil))
		c.record(e)
		return
	}
	defer up.Close()
	if _, err := conn.Write(socksReply(socksSucceeded, up.LocalAddr())); err != nil {
		e.Error = err.Error()
		c.record(e)
		return
	}
	conn.SetDeadline(time.Time{})
	e.BytesUp, e.BytesDown = c.relay(ctx, conn, up)
	c.record(e)
}

// openSOCKS connects to the destination of an entry made by decide, or
// returns the reply code for the failure and updates e.
func (c *Config) openSOCKS(ctx context.Context, e *decisionlog.Entry, timeout time.Duration) (net.Conn, byte) {
	if !e.Allowed {
		return nil, socksNotAllowed
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	up, err := c.upstream(ctx, e.Host, e.Port)
	if err == nil {
		return up, socksSucceeded
	}
	var refused *refusedError
	var lookup *lookupError
	switch {
	case errors.As(err, &refused):
		e.Allowed, e.Reason, e.Rule = false, e.Reason+", but "+refused.Error(), ""
		return nil, socksNotAllowed
	case errors.As(err, &lookup):
		e.Error = err.Error()
		return nil, socksHostUnreachable
	}
	e.Error = err.Error()
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, socksConnectionRefused
	case errors.Is(err, syscall.ENETUNREACH):
		return nil, socksNetworkUnreachable
	case errors.Is(err, syscall.EHOSTUNREACH):
		return nil, socksHostUnreachable
	}
	return nil, socksGeneralFailure
}

// errAddressType is an ATYP the server does not know.
var errAddressType = errors.New("unknown address type")

// readSOCKSAddr reads DST.ADDR and DST.PORT of the given address type. The
// host is a name or an address in its usual text form.
func readSOCKSAddr(r io.Reader, atyp byte) (string, uint16, error) {
	var host string
	switch atyp {
	case socksIPv4:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return "", 0, err
		}
		host = netip.AddrFrom4(b).String()
	case socksIPv6:
		var b [16]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return "", 0, err
		}
		host = netip.AddrFrom16(b).String()
	case socksDomain:
		var n [1]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return "", 0, err
		}
		b := make([]byte, n[0])
		if _, err := io.ReadFull(r, b); err != nil {
			return "", 0, err
		}
		host = string(b)
	default:
		return "", 0, fmt.Errorf("%w %d", errAddressType, atyp)
	}
	var p [2]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		return "", 0, err
	}
	return host, binary.BigEndian.Uint16(p[:]), nil
}

// socksReply is VER REP RSV ATYP BND.ADDR BND.PORT; bound is the gateway's
// end of the upstream connection, or nil for 0.0.0.0:0.
func socksReply(code byte, bound net.Addr) []byte {
	ap := netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
	if a, ok := bound.(*net.TCPAddr); ok {
		ap = a.AddrPort()
	}
	addr := ap.Addr().Unmap()
	if !addr.IsValid() {
		addr = netip.IPv4Unspecified()
	}
	b := []byte{socksVersion, code, 0, socksIPv6}
	if addr.Is4() {
		b[3] = socksIPv4
	}
	b = append(b, addr.AsSlice()...)
	return binary.BigEndian.AppendUint16(b, ap.Port())
}
