package gateway

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
)

// loopbackNet is the gateway's view of the network in a test: names map to
// addresses, every lookup and dial is recorded, and a dial to upstream4 goes
// to loopback (any other fails, so a bug cannot reach out).
type loopbackNet struct {
	names map[string][]netip.Addr
	// port, when set, replaces the port of every dial: the test's upstream
	// stands in for the one on the listener's port.
	port string

	mu       sync.Mutex
	resolved []string
	dialed   []string
}

func (n *loopbackNet) resolve(_ context.Context, host string) ([]netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.resolved = append(n.resolved, host)
	if a, ok := n.names[host]; ok {
		return a, nil
	}
	return nil, fmt.Errorf("lookup %s: no such host", host)
}

func (n *loopbackNet) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	n.dialed = append(n.dialed, addr)
	n.mu.Unlock()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if a, err := netip.ParseAddr(host); err != nil || a != upstream4 {
		return nil, fmt.Errorf("test dial to %s refused: not the test's upstream address", addr)
	}
	if n.port != "" {
		port = n.port
	}
	var d net.Dialer
	return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
}

func (n *loopbackNet) calls() (resolved, dialed []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.resolved...), append([]string(nil), n.dialed...)
}

// newTransparentConfig is a gateway config with these rules on n.
func newTransparentConfig(t *testing.T, allow, deny []string, n *loopbackNet) (*Config, *entryLog) {
	t.Helper()
	p, err := egress.ParsePolicy(allow, deny)
	if err != nil {
		t.Fatal(err)
	}
	log := &entryLog{}
	return &Config{Policy: p, Profile: ".propio/sandbox.yaml:9", Resolve: n.resolve, Dial: n.dial, Log: decisionlog.NewWriter(log)}, log
}

// testCert is a self-signed certificate for names, valid for an hour.
func testCert(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: names[0]},
		DNSNames:              names,
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// tlsUpstream is an HTTPS server on loopback with a certificate for
// allowed.test; it answers with the server name it was reached by.
func tlsUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "upstream reached as %s", r.TLS.ServerName)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{testCert(t, "allowed.test", "rebind.test")}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// portOf is the port of a host:port address or URL.
func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(addr, "https://"), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// upstreamAddrs is what the names of the transparent tests resolve to.
var upstreamAddrs = []netip.Addr{upstream4}

func TestServeTLS(t *testing.T) {
	t.Parallel()
	upstream := tlsUpstream(t)
	n := &loopbackNet{
		names: map[string][]netip.Addr{
			"allowed.test": upstreamAddrs,
			"denied.test":  upstreamAddrs,
			"rebind.test":  {netip.MustParseAddr("169.254.169.254")},
			"mixed.test":   {upstream4, netip.MustParseAddr("fd00:ec2::254")},
		},
		port: portOf(t, upstream.URL),
	}
	c, log := newTransparentConfig(t, []string{"allowed.test", "rebind.test", "mixed.test"}, nil, n)
	gw := startServing(t, func(l net.Listener) error { return c.ServeTLS(l, 443) })
	roots := x509.NewCertPool()
	roots.AddCert(upstream.Certificate())

	t.Run("allowed", func(t *testing.T) {
		// The client dials the gateway and checks the upstream's certificate
		// for allowed.test: the handshake went through the gateway untouched.
		client := &http.Client{
			Timeout: 10 * time.Second,
			Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "tcp", gw)
				},
				TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: "allowed.test"},
				DisableKeepAlives: true,
			},
		}
		resp, err := client.Get("https://allowed.test/")
		if err != nil {
			t.Fatalf("GET through the gateway: %v", err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != "upstream reached as allowed.test" {
			t.Fatalf("body %q (%v), want the upstream's answer", body, err)
		}
		e := log.waitFor(t, "sni", "allowed.test")
		if !e.Allowed || e.Port != 443 || e.Rule != "allowed.test" || e.BytesUp == 0 || e.BytesDown == 0 || e.Client == "" {
			t.Errorf("log entry %+v, want allowed on 443 by allowed.test with byte counts and a client", e)
		}
	})

	// handshakeFails dials the gateway as a TLS client for serverName and
	// returns the handshake's error.
	handshakeFails := func(t *testing.T, serverName string) {
		t.Helper()
		conn, err := net.DialTimeout("tcp", gw, 5*time.Second)
		if errors.Is(err, syscall.ECONNRESET) {
			return // reset before the dial returned
		}
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		err = tls.Client(conn, &tls.Config{RootCAs: roots, ServerName: serverName}).Handshake()
		if err == nil {
			t.Fatalf("handshake for %q through the gateway succeeded, want it refused", serverName)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("handshake for %q timed out, want it refused at once: %v", serverName, err)
		}
	}

	t.Run("denied", func(t *testing.T) {
		handshakeFails(t, "denied.test")
		e := log.waitFor(t, "sni", "denied.test")
		if e.Allowed || e.Reason != "no network.allow rule matches" || e.Port != 443 {
			t.Errorf("log entry %+v, want denied: no rule", e)
		}
	})

	t.Run("no server name", func(t *testing.T) {
		handshakeFails(t, "127.0.0.1") // crypto/tls sends no server_name for an address
		e := log.waitFor(t, "sni", "")
		if e.Allowed || e.Reason != "no server name" {
			t.Errorf("log entry %+v, want denied: no server name", e)
		}
	})

	t.Run("rebinding to metadata", func(t *testing.T) {
		handshakeFails(t, "rebind.test")
		e := log.waitFor(t, "sni", "rebind.test")
		if e.Allowed || !strings.Contains(e.Reason, "169.254.169.254") || !strings.Contains(e.Reason, "always denied") {
			t.Errorf("log entry %+v, want refused: resolves to a metadata address", e)
		}
	})

	t.Run("one metadata address among others", func(t *testing.T) {
		handshakeFails(t, "mixed.test")
		e := log.waitFor(t, "sni", "mixed.test")
		if e.Allowed || !strings.Contains(e.Reason, "fd00:ec2::254") {
			t.Errorf("log entry %+v, want refused: resolves to a metadata address", e)
		}
	})

	// Subtests without t.Parallel have all finished here.
	resolved, dialed := n.calls()
	for _, d := range dialed {
		if d != "192.0.2.1:443" {
			t.Errorf("the gateway dialled %s; only allowed.test (192.0.2.1:443) may be dialled", d)
		}
	}
	for _, r := range resolved {
		if r == "denied.test" {
			t.Errorf("the gateway resolved denied.test")
		}
	}
}

func TestServeHostHTTP(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "upstream: %s %s host=%s body=%q", r.Method, r.URL.Path, r.Host, body)
	}))
	t.Cleanup(upstream.Close)
	n := &loopbackNet{
		names: map[string][]netip.Addr{"allowed.test": upstreamAddrs, "denied.test": upstreamAddrs, "rebind.test": {netip.MustParseAddr("169.254.169.254")}},
		port:  portOf(t, upstream.URL),
	}
	c, log := newTransparentConfig(t, []string{"allowed.test", "rebind.test", "unresolvable.test"}, nil, n)
	gw := startServing(t, func(l net.Listener) error { return c.ServeHostHTTP(l, 80) })

	// exchange sends a raw request to the gateway and reads the response.
	exchange := func(t *testing.T, request string) (int, string) {
		t.Helper()
		conn, err := net.DialTimeout("tcp", gw, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, request); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("reading the gateway's response: %v", err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading the body: %v", err)
		}
		return resp.StatusCode, string(body)
	}

	tests := map[string]struct {
		request string
		status  int
		body    []string          // parts of the body
		log     decisionlog.Entry // Via, Host, Allowed and a part of Reason are checked
	}{
		"allowed": {
			request: "POST /v1/x HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
			status:  200,
			body:    []string{`upstream: POST /v1/x host=allowed.test body="hello"`},
			log:     decisionlog.Entry{Host: "allowed.test", Allowed: true, Reason: "allowed by"},
		},
		"denied": {
			request: "GET / HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n",
			status:  403,
			body:    []string{"denied.test is not allowed (no network.allow rule matches)", "add to network.allow (.propio/sandbox.yaml:9):", `- "denied.test"`},
			log:     decisionlog.Entry{Host: "denied.test", Reason: "no network.allow rule matches"},
		},
		"denied with a body still unread": {
			request: "POST / HTTP/1.1\r\nHost: denied2.test\r\nContent-Length: 100000\r\n\r\n" + strings.Repeat("x", 100000),
			status:  403,
			body:    []string{"denied2.test is not allowed"},
			log:     decisionlog.Entry{Host: "denied2.test", Reason: "no network.allow rule matches"},
		},
		"rebinding": {
			request: "GET / HTTP/1.1\r\nHost: rebind.test\r\n\r\n",
			status:  403,
			body:    []string{"169.254.169.254", "always denied"},
			log:     decisionlog.Entry{Host: "rebind.test", Reason: "always denied"},
		},
		"unresolvable": {
			request: "GET / HTTP/1.1\r\nHost: unresolvable.test\r\n\r\n",
			status:  502,
			body:    []string{"cannot reach unresolvable.test", "no such host"},
			log:     decisionlog.Entry{Host: "unresolvable.test", Allowed: true, Reason: "allowed by"},
		},
		"no Host": {
			request: "GET / HTTP/1.0\r\n\r\n",
			status:  400,
			body:    []string{"no Host header"},
			log:     decisionlog.Entry{Host: "", Reason: "no Host header"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			status, body := exchange(t, tt.request)
			if status != tt.status {
				t.Errorf("status %d, want %d; body %q", status, tt.status, body)
			}
			for _, part := range tt.body {
				if !strings.Contains(body, part) {
					t.Errorf("body %q does not say %q", body, part)
				}
			}
			e := log.waitFor(t, "host", tt.log.Host)
			if e.Allowed != tt.log.Allowed || !strings.Contains(e.Reason, tt.log.Reason) || e.Port != 80 {
				t.Errorf("log entry %+v, want allowed=%v on port 80 with a reason saying %q", e, tt.log.Allowed, tt.log.Reason)
			}
		})
	}
}

func TestServeHostHTTPClient(t *testing.T) {
	t.Parallel()
	// The same through net/http's client, as a tool in the sandbox would do it.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "plain upstream")
	}))
	t.Cleanup(upstream.Close)
	n := &loopbackNet{names: map[string][]netip.Addr{"allowed.test": upstreamAddrs}, port: portOf(t, upstream.URL)}
	c, _ := newTransparentConfig(t, []string{"allowed.test"}, nil, n)
	gw := startServing(t, func(l net.Listener) error { return c.ServeHostHTTP(l, 80) })
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", gw)
		},
		DisableKeepAlives: true,
	}}
	for _, tt := range []struct {
		url, body string
		status    int
	}{
		{"http://allowed.test/", "plain upstream", 200},
		{"http://denied.test/", `add to network.allow (.propio/sandbox.yaml:9):` + "\n" + `    - "denied.test"`, 403},
	} {
		resp, err := client.Get(tt.url)
		if err != nil {
			t.Fatalf("GET %s: %v", tt.url, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || !strings.Contains(string(body), tt.body) {
			t.Errorf("GET %s = %d %q, want %d with %q", tt.url, resp.StatusCode, body, tt.status, tt.body)
		}
	}
}

// tcpServer runs handle for each connection on a loopback listener.
func tcpServer(t *testing.T, handle func(net.Conn)) (addr string, port uint16) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				handle(conn)
			})
		}
	})
	ap := netip.MustParseAddrPort(l.Addr().String())
	return l.Addr().String(), ap.Port()
}

func TestServeForward(t *testing.T) {
	t.Parallel()
	_, greetPort := tcpServer(t, func(conn net.Conn) {
		_, _ = io.WriteString(conn, "SSH-2.0-test\r\n")
	})
	// echo answers once the client has half-closed: the forward must pass
	// the half-close on and keep the other direction open.
	_, echoPort := tcpServer(t, func(conn net.Conn) {
		b, _ := io.ReadAll(conn)
		_, _ = fmt.Fprintf(conn, "got %q", b)
	})
	n := &loopbackNet{names: map[string][]netip.Addr{"ssh.test": upstreamAddrs, "echo.test": upstreamAddrs, "rebind.test": {netip.MustParseAddr("169.254.169.254")}}}
	rule := fmt.Sprintf("ssh.test:%d", greetPort)
	c, log := newTransparentConfig(t, []string{rule, fmt.Sprintf("echo.test:%d", echoPort), fmt.Sprintf("rebind.test:%d", greetPort)}, nil, n)
	// The same host:port with the rule absent.
	absent, absentLog := newTransparentConfig(t, []string{"ssh.test", "ssh.test:2222"}, nil, n)

	dial := func(t *testing.T, addr string) net.Conn {
		t.Helper()
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		return conn
	}
	// readRefused reads what a refused forward sends: nothing, and a reset
	// that may come before the dial has returned.
	readRefused := func(t *testing.T, addr string) []byte {
		t.Helper()
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if errors.Is(err, syscall.ECONNRESET) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the refused connection stayed open")
		}
		return b
	}

	t.Run("allowed", func(t *testing.T) {
		t.Parallel()
		gw := startServing(t, func(l net.Listener) error { return c.ServeForward(l, "ssh.test", greetPort) })
		conn := dial(t, gw)
		got, err := io.ReadAll(conn)
		if err != nil || string(got) != "SSH-2.0-test\r\n" {
			t.Fatalf("read %q (%v), want the greeting", got, err)
		}
		conn.Close() // the forward ends, and is logged, when both sides have
		e := log.waitFor(t, "tcp", "ssh.test")
		if !e.Allowed || e.Rule != rule || e.Port != greetPort || e.BytesDown != int64(len(got)) {
			t.Errorf("log entry %+v, want allowed by %s with %d bytes down", e, rule, len(got))
		}
	})

	t.Run("half-close", func(t *testing.T) {
		t.Parallel()
		gw := startServing(t, func(l net.Listener) error { return c.ServeForward(l, "echo.test", echoPort) })
		conn := dial(t, gw)
		if _, err := io.WriteString(conn, "ping"); err != nil {
			t.Fatal(err)
		}
		if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(conn)
		if err != nil || string(got) != `got "ping"` {
			t.Fatalf("read %q (%v), want the echo", got, err)
		}
		e := log.waitFor(t, "tcp", "echo.test")
		if !e.Allowed || e.BytesUp != 4 || e.BytesDown != int64(len(got)) || e.Error != "" {
			t.Errorf("log entry %+v, want allowed, 4 bytes up, %d down, no error", e, len(got))
		}
	})

	t.Run("rule absent", func(t *testing.T) {
		t.Parallel()
		gw := startServing(t, func(l net.Listener) error { return absent.ServeForward(l, "ssh.test", greetPort) })
		if got := readRefused(t, gw); len(got) != 0 {
			t.Fatalf("read %q through a denied forward, want nothing", got)
		}
		e := absentLog.waitFor(t, "tcp", "ssh.test")
		if e.Allowed || e.Port != greetPort || e.Reason != "no network.allow rule matches" {
			t.Errorf("log entry %+v, want denied on port %d", e, greetPort)
		}
	})

	t.Run("rebinding", func(t *testing.T) {
		t.Parallel()
		gw := startServing(t, func(l net.Listener) error { return c.ServeForward(l, "rebind.test", greetPort) })
		if got := readRefused(t, gw); len(got) != 0 {
			t.Fatalf("read %q, want nothing", got)
		}
		e := log.waitFor(t, "tcp", "rebind.test")
		if e.Allowed || !strings.Contains(e.Reason, "always denied") {
			t.Errorf("log entry %+v, want refused: metadata address", e)
		}
		_, dialed := n.calls()
		for _, d := range dialed {
			if strings.HasPrefix(d, "169.254.") {
				t.Errorf("the gateway dialled %s", d)
			}
		}
	})
}

func TestServeRecoversPanics(t *testing.T) {
	t.Parallel()
	c, log := newTransparentConfig(t, []string{"ssh.test:22"}, nil, &loopbackNet{})
	c.Resolve = func(context.Context, string) ([]netip.Addr, error) { panic("resolver broke") }
	gw := startServing(t, func(l net.Listener) error { return c.ServeForward(l, "ssh.test", 22) })
	for range 2 { // the server goes on after a panic
		conn, err := net.DialTimeout("tcp", gw, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if b, err := io.ReadAll(conn); len(b) != 0 {
			t.Errorf("read %q (%v), want the connection closed", b, err)
		}
		conn.Close()
	}
	e := log.waitFor(t, "tcp", "")
	if e.Allowed || e.Reason != "internal error" || e.Error != "panic: resolver broke" || e.Client == "" {
		t.Errorf("log entry %+v, want the recovered panic", e)
	}
}

func TestServeNeedsALog(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := (&Config{}).ServeTLS(l, 443); err == nil || !strings.Contains(err.Error(), "Log is required") {
		t.Errorf("ServeTLS without a log = %v, want an error", err)
	}
}
