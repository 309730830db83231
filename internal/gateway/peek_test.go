package gateway

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// peekConn is a connection that only reads: data, at most chunk bytes at a
// time when chunk is set. The peek functions call nothing else.
type peekConn struct {
	net.Conn
	r     io.Reader
	chunk int
}

func (c *peekConn) Read(p []byte) (int, error) {
	if c.chunk > 0 && len(p) > c.chunk {
		p = p[:c.chunk]
	}
	return c.r.Read(p)
}

func newPeekConn(data []byte, chunk int) *peekConn {
	return &peekConn{r: bytes.NewReader(data), chunk: chunk}
}

// captureClientHello returns the first TLS record crypto/tls sends as a
// client with cfg (a ServerName that is an address sends no server_name),
// read off a net.Pipe; the handshake then fails, as nobody answers.
func captureClientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	client, server := net.Pipe()
	defer client.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tls.Client(client, cfg).Handshake()
	}()
	_ = server.SetDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(server, hdr); err != nil {
		t.Fatalf("reading the ClientHello record header: %v", err)
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
	if _, err := io.ReadFull(server, body); err != nil {
		t.Fatalf("reading the ClientHello record: %v", err)
	}
	server.Close()
	<-done
	return append(hdr, body...)
}

// refragment splits the handshake bytes of one TLS record into records of at
// most n bytes, as a client may.
func refragment(record []byte, n int) []byte {
	var out []byte
	for body := record[5:]; len(body) > 0; {
		k := min(n, len(body))
		out = append(out, record[0], record[1], record[2], byte(k>>8), byte(k))
		out = append(out, body[:k]...)
		body = body[k:]
	}
	return out
}

// helloWith builds a ClientHello record by hand with the given extension
// block (nil: no extensions at all).
func helloWith(exts []byte) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...) // random
	body = append(body, 0)                   // session id
	body = append(body, 0, 2, 0x13, 0x01)    // one cipher suite
	body = append(body, 1, 0)                // null compression
	if exts != nil {
		body = binary.BigEndian.AppendUint16(body, uint16(len(exts)))
		body = append(body, exts...)
	}
	hs := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{0x16, 3, 1, byte(len(hs) >> 8), byte(len(hs))}, hs...)
}

// ext is one extension; sni is a server_name extension with these entries
// (name type, name).
func ext(typ uint16, data []byte) []byte {
	out := binary.BigEndian.AppendUint16(nil, typ)
	out = binary.BigEndian.AppendUint16(out, uint16(len(data)))
	return append(out, data...)
}

type sniEntry struct {
	kind byte
	name string
}

func sni(entries ...sniEntry) []byte {
	var list []byte
	for _, e := range entries {
		list = append(list, e.kind)
		list = binary.BigEndian.AppendUint16(list, uint16(len(e.name)))
		list = append(list, e.name...)
	}
	return ext(0, append(binary.BigEndian.AppendUint16(nil, uint16(len(list))), list...))
}

func TestPeekSNI(t *testing.T) {
	t.Parallel()
	hello := captureClientHello(t, &tls.Config{ServerName: "allowed.test"})
	noName := captureClientHello(t, &tls.Config{ServerName: "127.0.0.1"})
	tls12 := captureClientHello(t, &tls.Config{ServerName: "tls12.test", MaxVersion: tls.VersionTLS12})
	alpn := captureClientHello(t, &tls.Config{ServerName: "alpn.test", NextProtos: []string{"h2", "http/1.1"}})
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	tests := map[string]struct {
		data  []byte
		chunk int
		want  string // the server name, or "error: <part of the message>"
	}{
		"crypto/tls hello":           {data: cat(hello, []byte("rest of the stream")), want: "allowed.test"},
		"one byte at a time":         {data: hello, chunk: 1, want: "allowed.test"},
		"TLS 1.2 hello":              {data: tls12, want: "tls12.test"},
		"hello with ALPN":            {data: alpn, want: "alpn.test"},
		"split over records":         {data: refragment(hello, 37), want: "allowed.test"},
		"four bytes per record":      {data: refragment(hello, 4), want: "allowed.test"},
		"too many small records":     {data: refragment(helloWith(cat(ext(21, make([]byte, 6000)), sni(sniEntry{0, "a.test"}))), 1), want: "error: too long"},
		"padded to the limit":        {data: helloWith(cat(ext(21, make([]byte, 16000)), sni(sniEntry{0, "a.test"}))), want: "a.test"},
		"hand-made hello":            {data: helloWith(sni(sniEntry{0, "a.test"})), want: "a.test"},
		"other extensions first":     {data: helloWith(cat(ext(10, []byte{0, 2, 0, 29}), sni(sniEntry{0, "b.test"}), ext(43, []byte{2, 3, 4}))), want: "b.test"},
		"unknown name type skipped":  {data: helloWith(sni(sniEntry{7, "junk"}, sniEntry{0, "c.test"})), want: "c.test"},
		"no server name (address)":   {data: noName, want: "error: no server name"},
		"no extensions":              {data: helloWith(nil), want: "error: no extensions"},
		"empty extension block":      {data: helloWith([]byte{}), want: "error: no server name"},
		"two server_name extensions": {data: helloWith(cat(sni(sniEntry{0, "a.test"}), sni(sniEntry{0, "b.test"}))), want: "error: two server_name"},
		"trailing dot":               {data: helloWith(sni(sniEntry{0, "a.test."})), want: "error: invalid server name"},
		"space in name":              {data: helloWith(sni(sniEntry{0, "a b.test"})), want: "error: invalid server name"},
		"empty name":                 {data: helloWith(sni(sniEntry{0, ""})), want: "error: invalid server name"},
		"empty name list":            {data: helloWith(ext(0, []byte{0, 0})), want: "error: malformed"},
		"extension overruns":         {data: helloWith([]byte{0, 0, 0, 9, 0}), want: "error: malformed"},
		"truncated":                  {data: hello[:len(hello)-1], want: "error: reading record"},
		"empty":                      {data: nil, want: "error: reading record header"},
		"plain HTTP":                 {data: []byte("GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"), want: "error: not a handshake record"},
		"SSLv2 hello":                {data: []byte{0x80, 0x2e, 0x01, 0x03, 0x01}, want: "error: not a handshake record"},
		"record version 2":           {data: []byte{0x16, 2, 0, 0, 1, 1}, want: "error: unsupported record version"},
		"empty record":               {data: []byte{0x16, 3, 1, 0, 0}, want: "error: empty handshake record"},
		"record too long":            {data: []byte{0x16, 3, 1, 0x40, 0x01}, want: "error: too long"},
		"hello too long":             {data: []byte{0x16, 3, 1, 0, 4, 1, 1, 0, 0}, want: "error: too long"},
		"server hello":               {data: []byte{0x16, 3, 3, 0, 4, 2, 0, 0, 0}, want: "error: not a client hello"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, replay, err := peekSNI(newPeekConn(tt.data, tt.chunk))
			if want, ok := strings.CutPrefix(tt.want, "error: "); ok {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("peekSNI = %q, %v; want an error with %q", got, err, want)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("peekSNI = %q, %v; want %q", got, err, tt.want)
			}
			if b, err := io.ReadAll(replay); err != nil || !bytes.Equal(b, tt.data) {
				t.Errorf("replay gave %d bytes (%v), want the %d sent", len(b), err, len(tt.data))
			}
		})
	}
}

func TestPeekHost(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		data  string
		chunk int
		host  string // or "error: <part of the message>"
		port  uint16
	}{
		"plain":                {data: "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", host: "allowed.test", port: 80},
		"body follows":         {data: "POST /x HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\nhello", host: "allowed.test", port: 80},
		"port and case":        {data: "GET / HTTP/1.1\r\nhost: Allowed.TEST:8080\r\n\r\n", host: "allowed.test", port: 8080},
		"IPv6 with port":       {data: "GET / HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n", host: "::1", port: 8443},
		"IPv6 without port":    {data: "GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n", host: "::1", port: 80},
		"bare LF":              {data: "GET / HTTP/1.0\nHost: a.test\n\n", host: "a.test", port: 80},
		"one byte at a time":   {data: "GET / HTTP/1.1\r\nX: y\r\nHost: a.test\r\n\r\n", chunk: 1, host: "a.test", port: 80},
		"two bytes at a time":  {data: "GET / HTTP/1.1\r\nHost: a.test\r\n\r\nbody", chunk: 2, host: "a.test", port: 80},
		"empty port":           {data: "GET / HTTP/1.1\r\nHost: a.test:\r\n\r\n", host: "a.test", port: 80},
		"no Host":              {data: "GET / HTTP/1.0\r\n\r\n", host: "error: no Host header"},
		"two Hosts":            {data: "GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n", host: "error: more than one Host"},
		"empty Host":           {data: "GET / HTTP/1.1\r\nHost: \r\n\r\n", host: "error: empty Host"},
		"port zero":            {data: "GET / HTTP/1.1\r\nHost: a.test:0\r\n\r\n", host: "error: malformed port"},
		"port too big":         {data: "GET / HTTP/1.1\r\nHost: a.test:65536\r\n\r\n", host: "error: malformed port"},
		"bare IPv6":            {data: "GET / HTTP/1.1\r\nHost: ::1\r\n\r\n", host: "error: needs brackets"},
		"bracketed name":       {data: "GET / HTTP/1.1\r\nHost: [a.test]:80\r\n\r\n", host: "error: malformed Host"},
		"userinfo":             {data: "GET / HTTP/1.1\r\nHost: u@a.test\r\n\r\n", host: "error: malformed Host"},
		"HTTP/2 preface":       {data: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", host: "error: not an HTTP/1.x"},
		"no version":           {data: "GET /\r\nHost: a.test\r\n\r\n", host: "error: malformed request line"},
		"TLS":                  {data: "\x16\x03\x01\x00\x05hello", host: "error: reading request head"},
		"ends before the head": {data: "GET / HTTP/1.1\r\nHost: a.test\r\n", host: "error: unexpected EOF"},
		"head too long":        {data: "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", maxHeadBytes) + "\r\nHost: a.test\r\n\r\n", host: "error: too long"},
		"header without colon": {data: "GET / HTTP/1.1\r\nHost a.test\r\n\r\n", host: "error: reading headers"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			host, port, replay, err := peekHost(newPeekConn([]byte(tt.data), tt.chunk))
			if want, ok := strings.CutPrefix(tt.host, "error: "); ok {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("peekHost = %q, %d, %v; want an error with %q", host, port, err, want)
				}
				return
			}
			if err != nil || host != tt.host || port != tt.port {
				t.Fatalf("peekHost = %q, %d, %v; want %q, %d", host, port, err, tt.host, tt.port)
			}
			if b, err := io.ReadAll(replay); err != nil || string(b) != tt.data {
				t.Errorf("replay gave %q (%v), want %q", b, err, tt.data)
			}
		})
	}
}

func FuzzPeekSNI(f *testing.F) {
	hello := captureClientHello(f, &tls.Config{ServerName: "allowed.test"})
	f.Add(hello)
	f.Add(captureClientHello(f, &tls.Config{ServerName: "127.0.0.1"}))
	f.Add(captureClientHello(f, &tls.Config{ServerName: "a-much-longer-name.with.many.labels.example.test"}))
	f.Add(refragment(hello, 50))
	f.Add(hello[:len(hello)/2])
	f.Add(helloWith(sni(sniEntry{7, "x"}, sniEntry{0, "b.test"})))
	f.Add(helloWith(nil))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		name, replay, err := peekSNI(newPeekConn(data, 0))
		if err != nil {
			return
		}
		if checkServerName([]byte(name)) != nil {
			t.Fatalf("peekSNI returned the invalid name %q", name)
		}
		if b, err := io.ReadAll(replay); err != nil || !bytes.Equal(b, data) {
			t.Fatalf("replay gave %d bytes (%v), want the %d sent", len(b), err, len(data))
		}
	})
}

func FuzzPeekHost(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: allowed.test\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
		"POST /v1/chat HTTP/1.1\r\nHost: api.example.test:8080\r\nContent-Length: 2\r\n\r\n{}",
		"GET http://a.test/ HTTP/1.0\nHost: [::1]:80\n\n",
		"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"GET / HTTP/1.1\r\n X: folded\r\nHost: a.test\r\n\r\n",
		"",
	} {
		f.Add([]byte(s), uint8(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		host, port, replay, err := peekHost(newPeekConn(data, 0))
		host2, port2, _, err2 := peekHost(newPeekConn(data, 1+int(chunk%16)))
		if (err == nil) != (err2 == nil) || host != host2 || port != port2 {
			t.Fatalf("reading at once: %q, %d, %v; in chunks of %d: %q, %d, %v", host, port, err, 1+chunk%16, host2, port2, err2)
		}
		if err != nil {
			return
		}
		if host == "" || port == 0 {
			t.Fatalf("peekHost = %q, %d with no error", host, port)
		}
		if b, err := io.ReadAll(replay); err != nil || !bytes.Equal(b, data) {
			t.Fatalf("replay gave %d bytes (%v), want the %d sent", len(b), err, len(data))
		}
	})
}
