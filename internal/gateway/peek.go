package gateway

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
)

// maxHelloBytes bounds what peekSNI reads: one full-size TLS record (a
// 5-byte header and 2^14 bytes), which any real ClientHello fits in, even
// when split over several records.
const maxHelloBytes = 5 + 1<<14

// maxHeadBytes bounds the HTTP request head peekHost reads.
const maxHeadBytes = 64 << 10

// peekSNI reads the TLS ClientHello at the start of conn and returns its
// server_name. replay yields every byte read from conn, then the rest of
// conn, so the handshake can go on to the upstream untouched. The caller sets
// a read deadline. A connection without a server name is an error.
func peekSNI(conn net.Conn) (serverName string, replay io.Reader, err error) {
	var raw, hs []byte // raw: every byte read; hs: the handshake bytes inside the records
	for {
		var hdr [5]byte
		if len(raw)+len(hdr) > maxHelloBytes {
			return "", nil, errors.New("tls: client hello too long")
		}
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			return "", nil, fmt.Errorf("tls: reading record header: %w", err)
		}
		raw = append(raw, hdr[:]...)
		if hdr[0] != 0x16 { // handshake
			return "", nil, fmt.Errorf("tls: not a handshake record (type %#x)", hdr[0])
		}
		if hdr[1] != 3 {
			return "", nil, fmt.Errorf("tls: unsupported record version %d.%d", hdr[1], hdr[2])
		}
		n := int(binary.BigEndian.Uint16(hdr[3:5]))
		if n == 0 {
			return "", nil, errors.New("tls: empty handshake record")
		}
		if len(raw)+n > maxHelloBytes {
			return "", nil, errors.New("tls: client hello too long")
		}
		start := len(raw)
		raw = append(raw, make([]byte, n)...)
		if _, err := io.ReadFull(conn, raw[start:]); err != nil {
			return "", nil, fmt.Errorf("tls: reading record: %w", err)
		}
		hs = append(hs, raw[start:]...)
		if len(hs) < 4 {
			continue
		}
		if hs[0] != 1 { // client_hello
			return "", nil, fmt.Errorf("tls: first handshake message is type %d, not a client hello", hs[0])
		}
		size := 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]))
		if size > maxHelloBytes {
			return "", nil, errors.New("tls: client hello too long")
		}
		if len(hs) >= size {
			name, err := parseClientHello(hs[4:size])
			if err != nil {
				return "", nil, err
			}
			return name, io.MultiReader(bytes.NewReader(raw), conn), nil
		}
	}
}

// helloReader reads the big-endian fields of a ClientHello; every read
// checks the bounds, so malformed input gives an error, never a panic.
type helloReader []byte

func (r *helloReader) bytes(n int) (helloReader, bool) {
	if n < 0 || len(*r) < n {
		return nil, false
	}
	b := (*r)[:n]
	*r = (*r)[n:]
	return b, true
}

func (r *helloReader) u8Prefixed() (helloReader, bool) {
	n, ok := r.bytes(1)
	if !ok {
		return nil, false
	}
	return r.bytes(int(n[0]))
}

func (r *helloReader) u16() (int, bool) {
	b, ok := r.bytes(2)
	if !ok {
		return 0, false
	}
	return int(binary.BigEndian.Uint16(b)), true
}

func (r *helloReader) u16Prefixed() (helloReader, bool) {
	n, ok := r.u16()
	if !ok {
		return nil, false
	}
	return r.bytes(n)
}

// parseClientHello returns the host_name of the server_name extension
// (RFC 6066 section 3) of a ClientHello body.
func parseClientHello(body []byte) (string, error) {
	bad := errors.New("tls: malformed client hello")
	r := helloReader(body)
	if _, ok := r.bytes(2 + 32); !ok { // legacy_version, random
		return "", bad
	}
	if sid, ok := r.u8Prefixed(); !ok || len(sid) > 32 {
		return "", bad
	}
	if suites, ok := r.u16Prefixed(); !ok || len(suites) < 2 || len(suites)%2 != 0 {
		return "", bad
	}
	if comp, ok := r.u8Prefixed(); !ok || len(comp) < 1 {
		return "", bad
	}
	if len(r) == 0 {
		return "", errors.New("tls: no server name (client hello has no extensions)")
	}
	exts, ok := r.u16Prefixed()
	if !ok || len(r) != 0 {
		return "", bad
	}
	name := ""
	seen := false
	for len(exts) > 0 {
		typ, ok := exts.u16()
		if !ok {
			return "", bad
		}
		data, ok := exts.u16Prefixed()
		if !ok {
			return "", bad
		}
		if typ != 0 { // server_name
			continue
		}
		if seen {
			return "", errors.New("tls: two server_name extensions")
		}
		seen = true
		d := helloReader(data)
		list, ok := d.u16Prefixed()
		if !ok || len(d) != 0 || len(list) == 0 {
			return "", bad
		}
		for len(list) > 0 {
			kind, ok := list.bytes(1)
			if !ok {
				return "", bad
			}
			n, ok := list.u16Prefixed()
			if !ok {
				return "", bad
			}
			if kind[0] != 0 || name != "" { // host_name, the first one only
				continue
			}
			if err := checkServerName(n); err != nil {
				return "", err
			}
			name = string(n)
		}
	}
	if name == "" {
		return "", errors.New("tls: no server name")
	}
	return name, nil
}

// checkServerName accepts the printable ASCII names SNI may carry (RFC 6066:
// no trailing dot); the policy decides whether the name is a valid host.
func checkServerName(n []byte) error {
	if len(n) == 0 || n[len(n)-1] == '.' {
		return fmt.Errorf("tls: invalid server name %q", n)
	}
	for _, c := range n {
		if c <= ' ' || c >= 0x7f {
			return fmt.Errorf("tls: invalid server name %q", n)
		}
	}
	return nil
}

// peekHost reads the HTTP/1.x request head at the start of conn and returns
// the host and port of its Host header (port 80 when the header has none).
// replay yields every byte read from conn, then the rest of conn. The caller
// sets a read deadline.
func peekHost(conn net.Conn) (host string, port uint16, replay io.Reader, err error) {
	buf := make([]byte, 0, 4096)
	end := -1
	for end < 0 {
		if len(buf) >= maxHeadBytes {
			return "", 0, nil, errors.New("http: request head too long")
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		limit := min(cap(buf), maxHeadBytes)
		n, err := conn.Read(buf[len(buf):limit])
		// Look again from just before the new bytes: the blank line may straddle two reads.
		from := max(len(buf)-2, 0)
		buf = buf[:len(buf)+n]
		end = headEnd(buf, from)
		if end < 0 && err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return "", 0, nil, fmt.Errorf("http: reading request head: %w", err)
		}
	}
	host, port, err = parseHead(buf[:end])
	if err != nil {
		return "", 0, nil, err
	}
	return host, port, io.MultiReader(bytes.NewReader(buf), conn), nil
}

// headEnd is the length of the request head in b (through the blank line
// that ends it), or -1. A line may end in LF or CRLF, as net/textproto allows.
func headEnd(b []byte, from int) int {
	for i := from; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		if i+1 < len(b) && b[i+1] == '\n' {
			return i + 2
		}
		if i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n' {
			return i + 3
		}
	}
	return -1
}

// parseHead checks the request line of an HTTP/1.x head and returns the host
// and port of its one Host header.
func parseHead(head []byte) (string, uint16, error) {
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(head)))
	line, err := tp.ReadLine()
	if err != nil {
		return "", 0, fmt.Errorf("http: reading request line: %w", err)
	}
	method, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || method == "" || target == "" {
		return "", 0, fmt.Errorf("http: malformed request line %q", line)
	}
	if proto != "HTTP/1.0" && proto != "HTTP/1.1" {
		return "", 0, fmt.Errorf("http: not an HTTP/1.x request (%q)", proto)
	}
	hdr, err := tp.ReadMIMEHeader()
	if err != nil {
		return "", 0, fmt.Errorf("http: reading headers: %w", err)
	}
	hosts := hdr.Values("Host")
	switch {
	case len(hosts) == 0:
		return "", 0, errors.New("http: no Host header")
	case len(hosts) > 1:
		return "", 0, errors.New("http: more than one Host header")
	}
	return splitHostHeader(hosts[0])
}

// splitHostHeader splits a Host header value into a lower-case host (an IPv6
// address without brackets) and a port, 80 when there is none.
func splitHostHeader(v string) (string, uint16, error) {
	v = strings.TrimSpace(v)
	host, port := v, uint16(80)
	if strings.HasPrefix(v, "[") || strings.Count(v, ":") == 1 {
		h, p, err := net.SplitHostPort(v)
		if err != nil {
			if !strings.HasPrefix(v, "[") || !strings.HasSuffix(v, "]") {
				return "", 0, fmt.Errorf("http: malformed Host header %q", v)
			}
			h, p = v[1:len(v)-1], "" // [v6] without a port
		}
		if strings.HasPrefix(v, "[") {
			if _, err := netip.ParseAddr(h); err != nil {
				return "", 0, fmt.Errorf("http: malformed Host header %q", v)
			}
		}
		host = h
		if p != "" {
			n, err := strconv.ParseUint(p, 10, 16)
			if err != nil || n == 0 {
				return "", 0, fmt.Errorf("http: malformed port in Host header %q", v)
			}
			port = uint16(n)
		}
	} else if strings.Contains(v, ":") {
		return "", 0, fmt.Errorf("http: malformed Host header %q (an IPv6 address needs brackets)", v)
	}
	if host == "" {
		return "", 0, errors.New("http: empty Host header")
	}
	for _, c := range []byte(host) {
		if c <= ' ' || c >= 0x7f || c == '/' || c == '@' {
			return "", 0, fmt.Errorf("http: malformed Host header %q", v)
		}
	}
	return strings.ToLower(host), port, nil
}
