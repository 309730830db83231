package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/proxy"
)

// socksDial connects to target through the SOCKS5 proxy at addr with the
// golang.org/x/net client, and returns the TCP connection under it (which can
// half-close).
func socksDial(t *testing.T, addr, target string) (net.Conn, error) {
	t.Helper()
	forward := &tcpRecorder{}
	d, err := proxy.SOCKS5("tcp", addr, nil, forward)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	_, err = d.(proxy.ContextDialer).DialContext(ctx, "tcp", target)
	if forward.conn != nil {
		t.Cleanup(func() { forward.conn.Close() })
	}
	if err != nil {
		return nil, err
	}
	forward.conn.SetDeadline(time.Now().Add(ioTimeout))
	return forward.conn, nil
}

// tcpRecorder dials for the SOCKS5 client and keeps the connection.
type tcpRecorder struct{ conn net.Conn }

func (r *tcpRecorder) Dial(network, addr string) (net.Conn, error) {
	return r.DialContext(context.Background(), network, addr)
}

func (r *tcpRecorder) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: ioTimeout}
	conn, err := d.DialContext(ctx, network, addr)
	r.conn = conn
	return conn, err
}

func TestSOCKS5(t *testing.T) {
	t.Parallel()
	p, _ := startGreeter(t, "tcp4")
	q, _ := startGreeter(t, "tcp4")
	tests := ruleCases(p, q)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := newExplicitGateway(t, tt.allow, tt.deny, nil)
			conn, err := socksDial(t, g.socks, hostPort(tt.host, tt.port))
			if !tt.allowed {
				if err == nil || !strings.Contains(err.Error(), "connection not allowed by ruleset") {
					t.Fatalf("SOCKS5 CONNECT %s: %v, want connection not allowed by ruleset", hostPort(tt.host, tt.port), err)
				}
			} else {
				if err != nil {
					t.Fatalf("SOCKS5 CONNECT %s: %v", hostPort(tt.host, tt.port), err)
				}
				greet(t, conn, bufio.NewReader(conn))
			}
			e := g.log.wait(t, 1)[0]
			checkEntry(t, e, "socks5", tt.host, tt.port, tt.allowed, tt.rule, tt.reason)
			if tt.allowed && (e.BytesUp != 4 || e.BytesDown != int64(len(greeting))) {
				t.Errorf("bytes_up %d, bytes_down %d; want 4 and %d", e.BytesUp, e.BytesDown, len(greeting))
			}
		})
	}
}

// TestSOCKS5IPv6 reaches an IPv6 upstream (on [::1]) through an address rule.
func TestSOCKS5IPv6(t *testing.T) {
	t.Parallel()
	if l, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	} else {
		l.Close()
	}
	p, _ := startGreeter(t, "tcp6")
	target := hostPort(upstream6.String(), p)
	g := newExplicitGateway(t, []string{target}, nil, nil)
	conn, err := socksDial(t, g.socks, target)
	if err != nil {
		t.Fatalf("SOCKS5 CONNECT %s: %v", target, err)
	}
	greet(t, conn, bufio.NewReader(conn))
	checkEntry(t, g.log.wait(t, 1)[0], "socks5", upstream6.String(), p, true, target, "allowed by")
}

// TestSOCKS5Protocol speaks SOCKS5 by hand for what a well-behaved client
// library never sends.
func TestSOCKS5Protocol(t *testing.T) {
	t.Parallel()
	p, _ := startGreeter(t, "tcp4")
	port := binary.BigEndian.AppendUint16(nil, p)
	hello := []byte{5, 1, 0}
	failed := func(code byte) []byte { return []byte{5, 0, 5, code, 0, 1, 0, 0, 0, 0, 0, 0} }
	tests := []struct {
		name   string
		send   []byte
		want   []byte // the whole answer, then EOF
		reason string // of the log entry; empty: no entry
	}{
		{"no acceptable method", []byte{5, 1, 2}, []byte{5, 0xff}, "no method the gateway accepts"},
		{"no method at all", []byte{5, 0}, []byte{5, 0xff}, "no method the gateway accepts"},
		{"SOCKS4", []byte{4, 1, 0, 80, 127, 0, 0, 1, 0}, nil, "version 4"},
		{"BIND", cat(hello, []byte{5, 2, 0, 1, 127, 0, 0, 1}, port), failed(7), "command 2 is not supported"},
		{"UDP ASSOCIATE", cat(hello, []byte{5, 3, 0, 1, 127, 0, 0, 1}, port), failed(7), "command 3 is not supported"},
		{"unknown address type", cat(hello, []byte{5, 1, 0, 9}), failed(8), "address type not supported"},
		{"IPv6 metadata address", cat(hello, []byte{5, 1, 0, 4, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, port), failed(2), "always denied"},
		{"domain that is no host name", cat(hello, []byte{5, 1, 0, 3, 5}, []byte("a b.c"), port), failed(2), "not a valid host name"},
		{"client that says nothing", nil, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := newExplicitGateway(t, []string{hostPort("allowed.test", p)}, nil, nil)
			conn, err := net.DialTimeout("tcp", g.socks, ioTimeout)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(ioTimeout))
			if _, err := conn.Write(tt.send); err != nil {
				t.Fatal(err)
			}
			conn.(*net.TCPConn).CloseWrite()
			got, err := io.ReadAll(conn)
			if tt.want == nil {
				err = nil // the gateway closed without reading everything: a reset is fine
			}
			if err != nil || !bytes.Equal(got, tt.want) {
				t.Errorf("answer % x, %v; want % x then EOF", got, err, tt.want)
			}
			if tt.reason == "" {
				time.Sleep(20 * time.Millisecond)
				if entries := g.log.entries(t); len(entries) != 0 {
					t.Errorf("log %+v, want nothing", entries)
				}
				return
			}
			if e := g.log.wait(t, 1)[0]; e.Via != "socks5" || e.Allowed || !strings.Contains(e.Reason, tt.reason) {
				t.Errorf("log entry %+v, want a refusal saying %q", e, tt.reason)
			}
		})
	}
}

// TestSOCKS5BoundAddress: the success reply carries the gateway's end of the
// upstream connection, and the relay starts right behind it.
func TestSOCKS5BoundAddress(t *testing.T) {
	t.Parallel()
	p, _ := startGreeter(t, "tcp4")
	g := newExplicitGateway(t, []string{hostPort(upstream4.String(), p)}, nil, nil)
	conn, err := net.DialTimeout("tcp", g.socks, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(ioTimeout))
	req := cat([]byte{5, 1, 0, 5, 1, 0, 1}, upstream4.AsSlice(), binary.BigEndian.AppendUint16(nil, p))
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, 12)
	if _, err := io.ReadFull(conn, reply); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(reply[:10], []byte{5, 0, 5, 0, 0, 1, 127, 0, 0, 1}) || binary.BigEndian.Uint16(reply[10:]) == 0 {
		t.Fatalf("reply % x, want success bound to 127.0.0.1 (the gateway's end, on loopback here) and a port", reply)
	}
	greet(t, conn, bufio.NewReader(conn))
	g.log.wait(t, 1)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
