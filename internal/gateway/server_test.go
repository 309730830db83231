package gateway

// Tests of Listen, Serve and Close: a whole gateway on 127.0.0.1 with every
// port mapped to a free one (Ports.Bind), upstreams on loopback behind
// upstream4, names under .test resolved by the test.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/propio/propio-sandbox/internal/decisionlog"
)

var loopbackAddr = netip.MustParseAddr("127.0.0.1")

// anyPort binds every listener on a free port.
func anyPort(uint16) uint16 { return 0 }

// resolveAllTest resolves every name to upstream4.
func resolveAllTest(_ context.Context, host string) ([]netip.Addr, error) {
	if !strings.HasSuffix(host, ".test") {
		return nil, fmt.Errorf("%s: not a test name", host)
	}
	return []netip.Addr{upstream4}, nil
}

// portMapDial is testDial with the upstream ports in ports replaced: the
// gateway dials port 80 or 443 of upstream4, and reaches the test's server on
// the port it got.
func portMapDial(ports map[uint16]uint16) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, err
		}
		if p, ok := ports[ap.Port()]; ok {
			ap = netip.AddrPortFrom(ap.Addr(), p)
		}
		return testDial(ctx, network, ap.String())
	}
}

// startServer listens and serves cfg on 127.0.0.1 until the test ends;
// cleanup closes the server and checks that Serve returned nil.
func startServer(t *testing.T, cfg *Config, ports Ports) *Server {
	t.Helper()
	s, err := Listen(cfg, loopbackAddr, ports)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve returned %v after Close, want nil", err)
			}
		case <-time.After(ioTimeout):
			t.Errorf("Serve did not return within %v of Close", ioTimeout)
		}
	})
	return s
}

// TestServerListeners: every listener of a Server answers, each through
// its own path to an upstream; after Close every address is free again.
func TestServerListeners(t *testing.T) {
	t.Parallel()
	web := startHTTPUpstream(t, false)
	secure := tlsUpstream(t)
	ssh, _ := startGreeter(t, "tcp4")
	log := &entryLog{}
	cfg := &Config{
		Policy:  mustPolicy(t, "allowed.test", hostPort("ssh.test", ssh)),
		Profile: ".propio/sandbox.yaml:7",
		Resolve: resolveAllTest,
		Dial:    portMapDial(map[uint16]uint16{80: serverPort(t, web), 443: serverPort(t, secure)}),
		Log:     decisionlog.NewWriter(log),
	}
	s, err := Listen(cfg, loopbackAddr, Ports{Bind: anyPort})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	addrs := s.Addrs()
	forward := "tcp:" + hostPort("ssh.test", ssh)
	names := slices.Sorted(maps.Keys(addrs))
	if want := slices.Sorted(slices.Values([]string{"dns-tcp", "dns-udp", "http", "http-proxy", "socks", "tls", forward})); !slices.Equal(names, want) {
		t.Fatalf("Addrs has %v, want %v", names, want)
	}
	for name, a := range addrs {
		if ip := netip.MustParseAddrPort(a.String()).Addr(); ip != loopbackAddr {
			t.Errorf("%s listens on %s, want only %s", name, a, loopbackAddr)
		}
	}
	if tcp, udp := addrs["dns-tcp"].(*net.TCPAddr).Port, addrs["dns-udp"].(*net.UDPAddr).Port; tcp != udp {
		t.Errorf("DNS listens on TCP port %d and UDP port %d, want one port", tcp, udp)
	}
	if len(s.Skipped) != 0 {
		t.Errorf("Skipped = %q, want none", s.Skipped)
	}

	t.Run("http-proxy", func(t *testing.T) {
		g := &explicitGateway{http: addrs["http-proxy"].String()}
		resp, err := proxyClient(t, g, nil).Get("http://allowed.test/hello")
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); resp.StatusCode != 200 || body != "hello from the upstream of allowed.test" {
			t.Errorf("%s %q, want the upstream's answer", resp.Status, body)
		}
		// A denial names the host and the profile's line.
		resp, err = proxyClient(t, g, nil).Get("http://other.test/")
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		if resp.StatusCode != 403 || !strings.Contains(body, "other.test is not allowed") || !strings.Contains(body, "(.propio/sandbox.yaml:7)") {
			t.Errorf("%s %q, want 403 naming other.test and .propio/sandbox.yaml:7", resp.Status, body)
		}
	})
	t.Run("socks", func(t *testing.T) {
		conn, err := socksDial(t, addrs["socks"].String(), hostPort("ssh.test", ssh))
		if err != nil {
			t.Fatal(err)
		}
		greet(t, conn, bufio.NewReader(conn))
	})
	for _, network := range []string{"udp", "tcp"} {
		t.Run("dns-"+network, func(t *testing.T) {
			resp := dnsExchange(t, network, addrs["dns-"+network].String(), dnsQuery(t, 7, "allowed.test.", dnsmessage.TypeA, dnsmessage.ClassINET), ioTimeout)
			rcode, answers := parseResponse(t, resp, 7, 1)
			if rcode != dnsmessage.RCodeSuccess || len(answers) != 1 {
				t.Fatalf("rcode %v, %d answers; want one answer", rcode, len(answers))
			}
			if a, ok := answers[0].Body.(*dnsmessage.AResource); !ok || netip.AddrFrom4(a.A) != loopbackAddr {
				t.Errorf("answer %v, want the gateway's address %s", answers[0].Body, loopbackAddr)
			}
		})
	}
	t.Run("http", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", addrs["http"].String(), ioTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(ioTimeout))
		io.WriteString(conn, "GET /hello HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); resp.StatusCode != 200 || body != "hello from the upstream of allowed.test" {
			t.Errorf("%s %q, want the upstream's answer, from port 80", resp.Status, body)
		}
	})
	t.Run("tls", func(t *testing.T) {
		roots := x509.NewCertPool()
		roots.AddCert(secure.Certificate())
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addrs["tls"].String())
			},
			TLSClientConfig:   &tls.Config{RootCAs: roots},
			DisableKeepAlives: true,
		}
		resp, err := (&http.Client{Transport: tr, Timeout: ioTimeout}).Get("https://allowed.test/")
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); body != "upstream reached as allowed.test" {
			t.Errorf("body %q, want the upstream's answer", body)
		}
	})
	t.Run("tcp forward", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", addrs[forward].String(), ioTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(ioTimeout))
		greet(t, conn, bufio.NewReader(conn))
	})
	for _, via := range []struct{ via, host string }{
		{"http", "allowed.test"}, {"socks5", "ssh.test"}, {"dns", "allowed.test"}, {"host", "allowed.test"}, {"sni", "allowed.test"}, {"tcp", "ssh.test"},
	} {
		if e := log.waitFor(t, via.via, via.host); !e.Allowed {
			t.Errorf("log entry %+v, want allowed", e)
		}
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve returned %v, want nil", err)
		}
	case <-time.After(ioTimeout):
		t.Fatalf("Serve did not return within %v of Close", ioTimeout)
	}
	for name, a := range addrs { // closed listeners leave their addresses free
		var c io.Closer
		if name == "dns-udp" {
			c, err = net.ListenPacket("udp", a.String())
		} else {
			c, err = net.Listen("tcp", a.String())
		}
		if err != nil {
			t.Errorf("%s: %s is still taken after Close: %v", name, a, err)
			continue
		}
		c.Close()
	}
}

// gatewayFrame is a stack frame in the gateway's own code (not its tests).
var gatewayFrame = regexp.MustCompile(`/internal/gateway/[a-z]+\.go:`)

// gatewayGoroutines are the stacks of the goroutines running gateway code,
// apart from the caller's.
func gatewayGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := strings.Split(string(buf), "\n\n")
	var out []string
	for _, s := range stacks[1:] { // the first is the caller's
		if gatewayFrame.MatchString(s) {
			out = append(out, s)
		}
	}
	return out
}

// TestServerCloseLeavesNothing: Close ends every listener and every
// connection, idle, in a handshake, relaying, or waiting for the bandwidth
// cap, and no gateway goroutine outlives it. It counts goroutines, so it does
// not run in parallel with the other tests.
func TestServerCloseLeavesNothing(t *testing.T) {
	if left := gatewayGoroutines(); len(left) > 0 {
		t.Fatalf("gateway goroutines before the test:\n%s", strings.Join(left, "\n\n"))
	}
	ssh, _ := startGreeter(t, "tcp4")
	sink := startTCP(t, "tcp4", func(conn net.Conn) { io.Copy(io.Discard, conn) })
	cfg := &Config{
		Policy:    mustPolicy(t, hostPort("ssh.test", ssh), hostPort("sink.test", sink)),
		Resolve:   resolveAllTest,
		Dial:      testDial,
		Log:       decisionlog.NewWriter(&entryLog{}),
		Bandwidth: 1000, // an upload of 1 MB would take 17 minutes
	}
	s, err := Listen(cfg, loopbackAddr, Ports{Bind: anyPort})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()

	var conns []net.Conn
	for name, a := range s.Addrs() { // an idle client on every TCP listener
		if name == "dns-udp" {
			continue
		}
		conn, err := net.DialTimeout("tcp", a.String(), ioTimeout)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		defer conn.Close()
		conns = append(conns, conn)
	}
	relaying, err := socksDial(t, s.Addrs()["socks"].String(), hostPort("ssh.test", ssh))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(relaying, make([]byte, len(greeting))); err != nil {
		t.Fatal(err)
	}
	capped, _, resp := connectVia(t, s.Addrs()["http-proxy"].String(), hostPort("sink.test", sink), nil)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	uploading := make(chan error, 1)
	go func() {
		_, err := capped.Write(make([]byte, 1<<20))
		uploading <- err
	}()
	conns = append(conns, relaying, capped)
	time.Sleep(50 * time.Millisecond) // the upload is now waiting for the cap

	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(start); d > ioTimeout/2 {
		t.Errorf("Close took %v", d)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve returned %v, want nil", err)
		}
	case <-time.After(ioTimeout):
		t.Fatalf("Serve did not return within %v of Close", ioTimeout)
	}
	for _, conn := range conns {
		conn.SetReadDeadline(time.Now().Add(ioTimeout))
		if _, err := io.Copy(io.Discard, conn); err != nil && !isReset(err) {
			t.Errorf("a client connection was not closed: %v", err)
		}
	}
	select {
	case <-uploading:
	case <-time.After(ioTimeout):
		t.Error("the capped upload is still being read after Close")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := gatewayGoroutines()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d gateway goroutines still run 5s after Close:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// isReset reports a connection reset by the gateway (a refused handshake may
// end that way), which counts as closed.
func isReset(err error) bool {
	return strings.Contains(err.Error(), "connection reset")
}

func TestListenSkipped(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		ports    Ports
		allow    []string
		deny     []string
		forwards []string
		skipped  []string
	}{
		"one host per port": {
			allow:    []string{"ssh.test:22", "SSH.test:22", "db.test:5432", "allowed.test", "tls.test:443", "web.test:80"},
			forwards: []string{"tcp:ssh.test:22", "tcp:db.test:5432"},
		},
		"ambiguous port": {
			allow: []string{"a.test:2222", "b.test:2222", "c.test:2222", "ssh.test:22"},
			skipped: []string{
				"a.test:2222: port 2222 is shared with b.test:2222, c.test:2222, and a forward carries one host per port",
				"b.test:2222: port 2222 is shared with a.test:2222, c.test:2222, and a forward carries one host per port",
				"c.test:2222: port 2222 is shared with a.test:2222, b.test:2222, and a forward carries one host per port",
			},
			forwards: []string{"tcp:ssh.test:22"},
		},
		"wildcard": {
			allow: []string{"*.wild.test:2223", "one.test:2223", "*.other.test:2224"},
			skipped: []string{
				"*.wild.test:2223: a wildcard names no single host to forward port 2223 to",
				"one.test:2223: port 2223 is shared with *.wild.test:2223, and a forward carries one host per port",
				"*.other.test:2224: a wildcard names no single host to forward port 2224 to",
			},
		},
		"address rules": {
			allow: []string{"192.0.2.7:2225", "[2001:db8::7]:2226", "192.0.2.8"},
			skipped: []string{
				"192.0.2.7:2225: an address rule: the sandbox dials the address itself, so only the proxies carry it",
				"[2001:db8::7]:2226: an address rule: the sandbox dials the address itself, so only the proxies carry it",
			},
		},
		"the gateway's own ports": {
			allow: []string{"proxy.test:3128", "socks.test:1080", "dns.test:53"},
			skipped: []string{
				"proxy.test:3128: port 3128 is the gateway's http-proxy port",
				"socks.test:1080: port 1080 is the gateway's socks port",
				"dns.test:53: port 53 is the gateway's dns port",
			},
		},
		"ports moved": {
			ports:    Ports{HTTPProxy: 8080},
			allow:    []string{"proxy.test:3128", "web.test:8080"},
			forwards: []string{"tcp:proxy.test:3128"},
			skipped:  []string{"web.test:8080: port 8080 is the gateway's http-proxy port"},
		},
		"denied": {
			allow:   []string{"db.test:5432"},
			deny:    []string{"db.test:5432"},
			skipped: []string{`db.test:5432: denied by network.deny "db.test:5432"`},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := mustPolicy(t, tt.allow...)
			p.Deny = mustPolicy(t, tt.deny...).Allow
			cfg := &Config{Policy: p, Resolve: resolveAllTest, Dial: testDial, Log: decisionlog.NewWriter(&entryLog{})}
			tt.ports.Bind = anyPort
			s := startServer(t, cfg, tt.ports)
			var forwards []string
			for name := range s.Addrs() {
				if strings.HasPrefix(name, "tcp:") {
					forwards = append(forwards, name)
				}
			}
			slices.Sort(forwards)
			slices.Sort(tt.forwards)
			if !slices.Equal(forwards, tt.forwards) {
				t.Errorf("forwards %q, want %q", forwards, tt.forwards)
			}
			if !slices.Equal(s.Skipped, tt.skipped) {
				t.Errorf("Skipped:\n%s\nwant:\n%s", strings.Join(s.Skipped, "\n"), strings.Join(tt.skipped, "\n"))
			}
		})
	}
}

// TestListenBindFailure: when one listener cannot be bound, Listen says
// which and where, and closes every listener it had bound.
func TestListenBindFailure(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		fail uint16 // the port, before Bind, that is taken
		name string
	}{
		{DefaultTLSPort, "tls"},
		{22, "tcp:ssh.test:22"},
		{DefaultDNSPort, "dns"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			taken, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer taken.Close()
			takenPort := uint16(taken.Addr().(*net.TCPAddr).Port)
			bound := map[uint16]uint16{} // each port Listen bound, before and after Bind
			bind := func(port uint16) uint16 {
				if port == tt.fail {
					return takenPort
				}
				free := freePort(t)
				bound[port] = free
				return free
			}
			cfg := &Config{Policy: mustPolicy(t, "ssh.test:22"), Resolve: resolveAllTest, Dial: testDial, Log: decisionlog.NewWriter(&entryLog{})}
			s, err := Listen(cfg, loopbackAddr, Ports{Bind: bind})
			if err == nil {
				s.Close()
				t.Fatal("Listen succeeded on a taken port")
			}
			want := fmt.Sprintf("gateway: listening for %s on 127.0.0.1:%d: ", tt.name, takenPort)
			if !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "address already in use") {
				t.Errorf("error %q, want %q and why", err, want)
			}
			if len(bound) == 0 {
				t.Fatal("nothing was bound before the failure: the test checks nothing")
			}
			for port, free := range bound {
				if l, err := net.Listen("tcp", hostPort("127.0.0.1", free)); err != nil {
					t.Errorf("the listener for port %d (bound on %d) is still open: %v", port, free, err)
				} else {
					l.Close()
				}
			}
		})
	}
}

// freePort is a TCP and UDP port on 127.0.0.1 that nothing used a moment ago.
func freePort(t *testing.T) uint16 {
	t.Helper()
	for range 10 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := uint16(l.Addr().(*net.TCPAddr).Port)
		pc, err := net.ListenPacket("udp", hostPort("127.0.0.1", port))
		l.Close()
		if err == nil {
			pc.Close()
			return port
		}
	}
	t.Fatal("no port free for both TCP and UDP")
	return 0
}

func TestListenRefuses(t *testing.T) {
	t.Parallel()
	log := decisionlog.NewWriter(&entryLog{})
	tests := map[string]struct {
		cfg   *Config
		addr  netip.Addr
		ports Ports
		want  string
	}{
		"no log":               {&Config{}, loopbackAddr, Ports{}, "Config.Log is required"},
		"every IPv4 address":   {&Config{Log: log}, netip.IPv4Unspecified(), Ports{}, "want the gateway's own address"},
		"every IPv6 address":   {&Config{Log: log}, netip.IPv6Unspecified(), Ports{}, "want the gateway's own address"},
		"no address":           {&Config{Log: log}, netip.Addr{}, Ports{}, "want the gateway's own address"},
		"two listeners on one": {&Config{Log: log}, loopbackAddr, Ports{HTTP: DefaultSOCKSPort, Bind: anyPort}, "the socks and http listeners cannot share port 1080"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, err := Listen(tt.cfg, tt.addr, tt.ports)
			if err == nil {
				s.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Listen = %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

// TestServeAndClose in every order: Serve after Close returns at once, and a
// second Serve is refused.
func TestServeAndClose(t *testing.T) {
	t.Parallel()
	cfg := &Config{Resolve: resolveAllTest, Dial: testDial, Log: decisionlog.NewWriter(&entryLog{})}
	s, err := Listen(cfg, loopbackAddr, Ports{Bind: anyPort})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(); err != nil {
		t.Errorf("Serve after Close = %v, want nil", err)
	}
	if err := s.Serve(); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a second Serve = %v, want an error", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("a second Close = %v, want nil", err)
	}
}

// TestServerBandwidth checks the cap end to end, coarsely: six transfers
// through six paths at once, three each way, take as long as the cap allows
// the sandbox as a whole, not each connection. Only a lower bound on time is
// checked, which a slow machine cannot break.
func TestServerBandwidth(t *testing.T) {
	t.Parallel()
	const (
		rate = 300_000 // bytes per second each way; the bucket holds 30,000
		size = 100_000 // bytes per transfer
		// Three transfers each way take (3*size - 30,000)/rate = 0.9s
		// together; capped per connection they would take 0.23s.
		atLeast = 600 * time.Millisecond
	)
	payload := bytes.Repeat([]byte("0123456789"), size/10)
	sink := startTCP(t, "tcp4", func(conn net.Conn) {
		io.Copy(io.Discard, conn)
	})
	source := startTCP(t, "tcp4", func(conn net.Conn) {
		conn.Write(payload)
	})
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPost:
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "%d", n)
		default:
			w.Write(payload)
		}
	}))
	t.Cleanup(web.Close)
	log := &entryLog{}
	cfg := &Config{
		Policy:    mustPolicy(t, hostPort("sink.test", sink), hostPort("source.test", source), "web.test"),
		Resolve:   resolveAllTest,
		Dial:      portMapDial(map[uint16]uint16{80: serverPort(t, web)}),
		Log:       decisionlog.NewWriter(log),
		Bandwidth: rate,
	}
	s := startServer(t, cfg, Ports{Bind: anyPort})
	addrs := s.Addrs()
	proxied := proxyClient(t, &explicitGateway{http: addrs["http-proxy"].String()}, nil)

	// upload sends the payload on conn, half-closes, and waits for the
	// upstream to close (once it has read everything).
	upload := func(conn net.Conn, r io.Reader) error {
		if _, err := conn.Write(payload); err != nil {
			return err
		}
		conn.(*net.TCPConn).CloseWrite()
		_, err := io.Copy(io.Discard, r)
		return err
	}
	// download reads until EOF and checks the payload arrived whole.
	download := func(r io.Reader) error {
		b, err := io.ReadAll(r)
		if err == nil && !bytes.Equal(b, payload) {
			err = fmt.Errorf("received %d bytes, not the %d of the payload", len(b), len(payload))
		}
		return err
	}
	transfers := map[string]struct {
		up  bool
		run func() error
	}{
		"CONNECT upload": {true, func() error {
			conn, br, resp := connectVia(t, addrs["http-proxy"].String(), hostPort("sink.test", sink), nil)
			if resp.StatusCode != 200 {
				return fmt.Errorf("CONNECT: %s", resp.Status)
			}
			return upload(conn, br)
		}},
		"SOCKS5 upload": {true, func() error {
			conn, err := socksDial(t, addrs["socks"].String(), hostPort("sink.test", sink))
			if err != nil {
				return err
			}
			return upload(conn, conn)
		}},
		"HTTP proxy POST": {true, func() error {
			resp, err := proxied.Post("http://web.test/", "application/octet-stream", bytes.NewReader(payload))
			if err != nil {
				return err
			}
			if body := readBody(t, resp); body != fmt.Sprint(size) {
				return fmt.Errorf("the upstream read %s bytes", body)
			}
			return nil
		}},
		"TCP forward download": {false, func() error {
			conn, err := net.DialTimeout("tcp", addrs["tcp:"+hostPort("source.test", source)].String(), ioTimeout)
			if err != nil {
				return err
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(ioTimeout))
			return download(conn)
		}},
		"HTTP by Host download": {false, func() error {
			conn, err := net.DialTimeout("tcp", addrs["http"].String(), ioTimeout)
			if err != nil {
				return err
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(ioTimeout))
			io.WriteString(conn, "GET / HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			return download(resp.Body)
		}},
		"HTTP proxy GET": {false, func() error {
			resp, err := proxied.Get("http://web.test/")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			return download(resp.Body)
		}},
	}
	var (
		mu   sync.Mutex
		last = map[bool]time.Duration{}
		wg   sync.WaitGroup
	)
	start := time.Now()
	for name, tr := range transfers {
		wg.Go(func() {
			if err := tr.run(); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			mu.Lock()
			last[tr.up] = max(last[tr.up], time.Since(start))
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, dir := range []bool{true, false} {
		name := map[bool]string{true: "up", false: "down"}[dir]
		if last[dir] < atLeast {
			t.Errorf("three transfers of %d bytes %s took %v, want at least %v at %d bytes per second for the whole gateway", size, name, last[dir], atLeast, rate)
		}
	}
	if e := log.waitFor(t, "tcp", "source.test"); e.BytesDown != size {
		t.Errorf("the forward logged %d bytes down, want %d", e.BytesDown, size)
	}
}
