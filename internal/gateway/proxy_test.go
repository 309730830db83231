package gateway

// Tests of the explicit path (HTTP proxy, CONNECT, SOCKS5). Every server runs
// on loopback and is started by the test; names end in .test and resolve only
// through Config.Resolve, to upstream4 (which testDial connects to loopback:
// the gateway itself never dials loopback) or, for rebinding, to an address
// that is never dialed.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
)

const (
	testProfile = ".propio/sandbox.yaml:9"
	ioTimeout   = 10 * time.Second // any one step of a test
)

// upstream4 and upstream6 stand for the upstream servers of a test: names
// resolve to them, and testDial connects to loopback in their place.
var (
	upstream4 = netip.MustParseAddr("192.0.2.1")   // TEST-NET-1
	upstream6 = netip.MustParseAddr("2001:db8::1") // the documentation prefix
)

// testDial is the gateway's dialer in tests: upstream4 and upstream6 are the
// loopback servers the test started, and any other address is refused, so a
// bug cannot reach out.
func testDial(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	to := map[netip.Addr]netip.Addr{upstream4: netip.AddrFrom4([4]byte{127, 0, 0, 1}), upstream6: netip.IPv6Loopback()}[ap.Addr()]
	if !to.IsValid() {
		return nil, fmt.Errorf("the test dialer refuses %s", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, netip.AddrPortFrom(to, ap.Port()).String())
}

// testNames is what the test resolver knows; anything else fails to resolve.
var testNames = map[string][]netip.Addr{
	"allowed.test":       {upstream4},
	"other.test":         {upstream4},
	"wild.test":          {upstream4},
	"sub.wild.test":      {upstream4},
	"deep.sub.wild.test": {upstream4},
	"api.corp.test":      {upstream4},
	"secret.corp.test":   {upstream4},
	"boom.test":          {upstream4},
	"rebind.test":        {netip.MustParseAddr("169.254.169.254")},
	"mixed.test":         {upstream4, netip.MustParseAddr("169.254.169.254")},
	"mapped.test":        {netip.MustParseAddr("::ffff:169.254.169.254")},
	"aws6.test":          {netip.MustParseAddr("fd00:ec2::254")},
	"loop.test":          {netip.MustParseAddr("127.0.0.1")},
	"loop6.test":         {netip.MustParseAddr("::1")},
	"self.test":          {ownAddr},
}

// ownAddr stands for the gateway's own address in TestOwnAddress.
var ownAddr = netip.MustParseAddr("192.0.2.9")

func resolveTestNames(_ context.Context, host string) ([]netip.Addr, error) {
	if host == "boom.test" {
		panic("resolver exploded")
	}
	if a, ok := testNames[strings.ToLower(host)]; ok {
		return slices.Clone(a), nil
	}
	return nil, fmt.Errorf("%s: not a name the test resolver knows", host)
}

// explicitGateway is a gateway with both explicit servers on loopback.
type explicitGateway struct {
	cfg   *Config
	http  string // host:port of the HTTP proxy
	socks string // host:port of the SOCKS5 proxy
	log   *entryLog
}

// newExplicitGateway starts both servers with the given rules; tweak, if not
// nil, edits the Config first. Cleanup closes the listeners and checks that
// both Serve calls return nil.
func newExplicitGateway(t testing.TB, allow, deny []string, tweak func(*Config)) *explicitGateway {
	t.Helper()
	p, err := egress.ParsePolicy(allow, deny)
	if err != nil {
		t.Fatal(err)
	}
	g := &explicitGateway{log: &entryLog{}}
	g.cfg = &Config{Policy: p, Profile: testProfile, Resolve: resolveTestNames, Dial: testDial, Log: decisionlog.NewWriter(g.log)}
	if tweak != nil {
		tweak(g.cfg)
	}
	g.http = startServing(t, g.cfg.ServeHTTPProxy)
	g.socks = startServing(t, g.cfg.ServeSOCKS)
	return g
}

// startServing runs serve on a loopback listener until the test ends.
func startServing(t testing.TB, serve func(net.Listener) error) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serve(l) }()
	t.Cleanup(func() {
		l.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve returned %v after its listener closed, want nil", err)
			}
		case <-time.After(ioTimeout):
			t.Errorf("Serve did not return within %v of its listener closing", ioTimeout)
		}
	})
	return l.Addr().String()
}

// startTCP runs handle for every connection to a loopback listener on
// network ("tcp4" or "tcp6") and returns its port. Cleanup closes the
// listener and the connections and waits for the handlers.
func startTCP(t *testing.T, network string, handle func(net.Conn)) uint16 {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "tcp6" {
		addr = "[::1]:0"
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() {
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(ioTimeout))
				handle(conn)
			})
		}
	})
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

const greeting = "220 hello from the upstream\r\n"

// startGreeter is an upstream that sends greeting, reads until EOF and
// closes; it returns its port and a channel that gets what each connection
// sent.
func startGreeter(t *testing.T, network string) (uint16, <-chan string) {
	t.Helper()
	got := make(chan string, 16)
	port := startTCP(t, network, func(conn net.Conn) {
		if _, err := io.WriteString(conn, greeting); err != nil {
			return
		}
		b, _ := io.ReadAll(conn)
		got <- string(b)
	})
	return port, got
}

// greet plays the client side of a greeter through conn (and br, which may
// hold bytes already read): read the greeting, send "bye\n", half-close, and
// expect EOF.
func greet(t *testing.T, conn net.Conn, br *bufio.Reader) {
	t.Helper()
	b := make([]byte, len(greeting))
	if _, err := io.ReadFull(br, b); err != nil || string(b) != greeting {
		t.Fatalf("read %q, %v; want the greeting %q", b, err, greeting)
	}
	if _, err := io.WriteString(conn, "bye\n"); err != nil {
		t.Fatal(err)
	}
	conn.(interface{ CloseWrite() error }).CloseWrite()
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the greeting read %q, %v; want EOF", rest, err)
	}
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	return port
}

func hostPort(host string, port uint16) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// connectVia sends CONNECT target to the HTTP proxy at proxy, with extra
// written right behind the request, and returns the connection, its reader
// and the response.
func connectVia(t *testing.T, proxy, target string, extra []byte) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", proxy, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(ioTimeout))
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n"
	if _, err := conn.Write(append([]byte(req), extra...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	return conn, br, resp
}

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkEntry compares the fields of a log entry a test cares about.
func checkEntry(t *testing.T, e decisionlog.Entry, via, host string, port uint16, allowed bool, rule, reason string) {
	t.Helper()
	if e.Via != via || e.Host != host || e.Port != port || e.Allowed != allowed || e.Rule != rule || !strings.Contains(e.Reason, reason) {
		t.Errorf("log entry %+v\nwant via %q host %q port %d allowed %v rule %q and a reason containing %q", e, via, host, port, allowed, rule, reason)
	}
	if !strings.HasPrefix(e.Client, "127.0.0.1:") {
		t.Errorf("log entry client = %q, want the client's loopback address", e.Client)
	}
}

// The advice of a denial hint, by kind of denial.
const (
	hintAdd     = "To allow it, add to network.allow (" + testProfile + "):\n    - "
	hintAddress = "To allow it, add an address rule to network.allow (" + testProfile + "):\n    - "
	hintNever   = "It can never be allowed: no rule in " + testProfile + " can change that."
)

// checkHint checks the body of a 403 for a denied destination: it names the
// destination and the profile, and gives the advice want.
func checkHint(t *testing.T, body, host string, port uint16, want string) {
	t.Helper()
	for _, want := range []string{egress.Suggest(host, port) + " is not allowed", testProfile, want} {
		if !strings.Contains(body, want) {
			t.Errorf("403 body %q does not contain %q", body, want)
		}
	}
}

// startHTTPUpstream serves /hello (the Host it was asked for) and /headers
// (the names of the headers it received).
func startHTTPUpstream(t *testing.T, tlsToo bool) *httptest.Server {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hello":
			fmt.Fprintf(w, "hello from the upstream of %s", r.Host)
		case "/count":
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "%d bytes", n)
		case "/headers":
			names := []string{"Host: " + r.Host}
			for k := range r.Header {
				names = append(names, k)
			}
			slices.Sort(names)
			fmt.Fprint(w, strings.Join(names, "\n"))
		default:
			http.NotFound(w, r)
		}
	})
	var s *httptest.Server
	if tlsToo {
		s = httptest.NewTLSServer(h)
	} else {
		s = httptest.NewServer(h)
	}
	t.Cleanup(s.Close)
	return s
}

func serverPort(t testing.TB, s *httptest.Server) uint16 {
	t.Helper()
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(u.Port())
	return uint16(p)
}

// proxyClient is an http.Client that uses the gateway's HTTP proxy.
func proxyClient(t *testing.T, g *explicitGateway, tlsConfig *tls.Config) *http.Client {
	t.Helper()
	tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: g.http}), TLSClientConfig: tlsConfig}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: ioTimeout}
}

func TestHTTPProxy(t *testing.T) {
	t.Parallel()
	up := startHTTPUpstream(t, false)
	port := serverPort(t, up)
	allow := []string{hostPort("allowed.test", port)}
	tests := []struct {
		name    string
		host    string
		port    uint16
		want    int
		rule    string
		reason  string
		hint    string
		wantErr string
	}{
		{name: "allowed name", host: "allowed.test", port: port, want: 200, rule: allow[0], reason: "allowed by network.allow"},
		{name: "name in upper case", host: "ALLOWED.test", port: port, want: 200, rule: allow[0], reason: "allowed by network.allow"},
		{name: "denied name", host: "other.test", port: port, want: 403, reason: "no network.allow rule matches", hint: hintAdd + `"other.test:` + strconv.Itoa(int(port)) + `"`},
		{name: "allowed name on another port", host: "allowed.test", port: 8080, want: 403, reason: "no network.allow rule matches", hint: hintAdd + `"allowed.test:8080"`},
		{name: "default port 80", host: "allowed.test", port: 80, want: 403, reason: "no network.allow rule matches", hint: hintAdd + `"allowed.test"`},
		{name: "raw address", host: "192.0.2.1", port: port, want: 403, reason: "raw addresses are denied", hint: hintAddress + `"192.0.2.1:` + strconv.Itoa(int(port)) + `"`},
		{name: "metadata address", host: "169.254.169.254", port: 80, want: 403, reason: "always denied", hint: hintNever},
		{name: "loopback address", host: "127.0.0.1", port: port, want: 403, reason: "loopback addresses are always denied", hint: hintNever},
		{name: "engine API port", host: "allowed.test", port: 2375, want: 403, reason: "the container engine's API port is always denied", hint: hintNever},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := newExplicitGateway(t, allow, nil, nil)
			u := "http://" + hostPort(tt.host, tt.port) + "/hello"
			if tt.port == 80 {
				u = "http://" + tt.host + "/hello"
			}
			resp, err := proxyClient(t, g, nil).Get(u)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != tt.want {
				t.Fatalf("GET %s: %s %q, want %d", u, resp.Status, body, tt.want)
			}
			e := g.log.wait(t, 1)[0]
			checkEntry(t, e, "http", tt.host, tt.port, tt.want == 200, tt.rule, tt.reason)
			if tt.want == 200 {
				if want := "hello from the upstream of " + hostPort(tt.host, tt.port); body != want {
					t.Errorf("body %q, want %q (the Host the client asked for)", body, want)
				}
				if e.BytesUp <= 0 || e.BytesDown <= int64(len(body)) {
					t.Errorf("bytes_up %d, bytes_down %d: want both counted, down more than the %d bytes of body", e.BytesUp, e.BytesDown, len(body))
				}
				return
			}
			checkHint(t, body, tt.host, tt.port, tt.hint)
			if e.BytesUp != 0 || e.BytesDown != 0 || e.Error != "" {
				t.Errorf("a denial logged bytes %d/%d, error %q; want none", e.BytesUp, e.BytesDown, e.Error)
			}
		})
	}
}

// TestHTTPProxyHeaders sends requests by hand: the gateway strips hop-by-hop
// and Proxy-* headers, sends the name from the request line as Host (not the
// Host header, not the address it dialed), adds no User-Agent, and decides
// every request of a kept-alive connection on its own.
func TestHTTPProxyHeaders(t *testing.T) {
	t.Parallel()
	up := startHTTPUpstream(t, false)
	port := serverPort(t, up)
	target := hostPort("allowed.test", port)
	g := newExplicitGateway(t, []string{target}, nil, nil)

	conn, err := net.DialTimeout("tcp", g.http, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(ioTimeout))
	br := bufio.NewReader(conn)
	fmt.Fprintf(conn, "GET http://%s/headers HTTP/1.1\r\nHost: other.test\r\n"+
		"Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nProxy-Foo: bar\r\n"+
		"Connection: X-Hop, keep-alive\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTe: trailers\r\nX-Keep: 1\r\n\r\n", target)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("%s %q", resp.Status, body)
	}
	// Connection is the gateway's own "close" to the upstream.
	if want := "Connection\nHost: " + target + "\nX-Keep"; body != want {
		t.Errorf("upstream received headers:\n%s\nwant:\n%s", body, want)
	}

	// The same connection, now to a denied name.
	fmt.Fprintf(conn, "GET http://%s/hello HTTP/1.1\r\nHost: %s\r\n\r\n", hostPort("other.test", port), target)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 403 {
		t.Fatalf("second request: %s %q, want 403", resp.Status, body)
	}
	entries := g.log.wait(t, 2)
	checkEntry(t, entries[0], "http", "allowed.test", port, true, target, "allowed")
	checkEntry(t, entries[1], "http", "other.test", port, false, "", "no network.allow rule matches")
}

// TestHTTPProxyPOST sends a body through the proxy. The client expects 100
// Continue, which the gateway answers at once instead of making it wait out
// its timeout; and a denied POST gets its 403 and can finish writing its
// body, which the gateway reads and drops.
func TestHTTPProxyPOST(t *testing.T) {
	t.Parallel()
	up := startHTTPUpstream(t, false)
	port := serverPort(t, up)
	g := newExplicitGateway(t, []string{hostPort("allowed.test", port)}, nil, nil)
	const size = 256 << 10
	client := proxyClient(t, g, nil)
	client.Transport.(*http.Transport).ExpectContinueTimeout = ioTimeout

	req, err := http.NewRequest("POST", "http://"+hostPort("allowed.test", port)+"/count", bytes.NewReader(make([]byte, size)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Expect", "100-continue")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 || body != fmt.Sprintf("%d bytes", size) {
		t.Fatalf("%s %q", resp.Status, body)
	}
	if d := time.Since(start); d > ioTimeout/2 {
		t.Errorf("the POST took %v: the client waited for 100 Continue", d)
	}
	if e := g.log.wait(t, 1)[0]; e.BytesUp <= size {
		t.Errorf("bytes_up %d, want more than the %d of the body", e.BytesUp, size)
	}

	// By hand: the client writes its whole body while the gateway answers.
	conn, err := net.DialTimeout("tcp", g.http, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(ioTimeout))
	written := make(chan error, 1)
	go func() {
		_, err := fmt.Fprintf(conn, "POST http://%s/count HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s",
			hostPort("other.test", port), size, make([]byte, size))
		written <- err
	}()
	resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("a denied POST: %v, want a 403", err)
	}
	if body := readBody(t, resp); resp.StatusCode != 403 {
		t.Fatalf("a denied POST: %s %q, want 403", resp.Status, body)
	}
	if err := <-written; err != nil {
		t.Errorf("writing the body of a denied POST: %v", err)
	}
	g.log.wait(t, 2)
}

// TestHTTPProxyStreams checks that a response the upstream sends in pieces
// reaches the client piece by piece, not when it ends.
func TestHTTPProxyStreams(t *testing.T) {
	t.Parallel()
	next := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-next:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "second\n")
	}))
	t.Cleanup(up.Close)
	port := serverPort(t, up)
	g := newExplicitGateway(t, []string{hostPort("allowed.test", port)}, nil, nil)

	resp, err := proxyClient(t, g, nil).Get("http://" + hostPort("allowed.test", port) + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); line != "first\n" || err != nil {
		t.Fatalf("read %q, %v; want the first line before the upstream sends the second", line, err)
	}
	close(next)
	if line, err := br.ReadString('\n'); line != "second\n" || err != nil {
		t.Fatalf("read %q, %v; want the second line", line, err)
	}
	resp.Body.Close()
	g.log.wait(t, 1)
}

func TestHTTPProxyBadRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, request, reason string
	}{
		{"origin-form request", "GET /hello HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "not a proxy request"},
		{"https absolute URI", "GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "use CONNECT"},
		{"CONNECT without a port", "CONNECT allowed.test HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "CONNECT wants host:port"},
		{"CONNECT to port 0", "CONNECT allowed.test:0 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "CONNECT wants host:port"},
		{"not HTTP", "HELLO THERE\r\n\r\n", "not an HTTP request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := newExplicitGateway(t, []string{"allowed.test"}, nil, nil)
			conn, err := net.DialTimeout("tcp", g.http, ioTimeout)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(ioTimeout))
			io.WriteString(conn, tt.request)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			if body := readBody(t, resp); resp.StatusCode != 400 || !strings.Contains(body, tt.reason) {
				t.Errorf("%s %q, want 400 saying %q", resp.Status, body, tt.reason)
			}
			if e := g.log.wait(t, 1)[0]; e.Allowed || e.Via != "http" || !strings.Contains(e.Reason, tt.reason) {
				t.Errorf("log entry %+v, want a refusal via http saying %q", e, tt.reason)
			}
		})
	}
}

// TestCONNECTTLS runs HTTPS through CONNECT to a TLS upstream.
func TestCONNECTTLS(t *testing.T) {
	t.Parallel()
	up := startHTTPUpstream(t, true)
	port := serverPort(t, up)
	g := newExplicitGateway(t, []string{hostPort("allowed.test", port)}, nil, nil)

	// Trust the upstream's certificate. It is issued for 127.0.0.1 and
	// example.com, not for allowed.test, so verify it as example.com: the
	// client still checks the chain and a name, unlike InsecureSkipVerify.
	tlsConfig := up.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	tlsConfig.ServerName = "example.com"
	client := proxyClient(t, g, tlsConfig)

	resp, err := client.Get("https://" + hostPort("allowed.test", port) + "/hello")
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 || body != "hello from the upstream of "+hostPort("allowed.test", port) {
		t.Fatalf("%s %q", resp.Status, body)
	}
	client.Transport.(*http.Transport).CloseIdleConnections() // ends the tunnel, which logs it
	e := g.log.wait(t, 1)[0]
	checkEntry(t, e, "connect", "allowed.test", port, true, hostPort("allowed.test", port), "allowed")
	if e.BytesUp <= 0 || e.BytesDown <= 0 {
		t.Errorf("bytes_up %d, bytes_down %d: want both counted", e.BytesUp, e.BytesDown)
	}

	_, err = client.Get("https://" + hostPort("other.test", port) + "/hello")
	if err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Errorf("GET through a denied CONNECT: %v, want a Forbidden error", err)
	}
	checkEntry(t, g.log.wait(t, 2)[1], "connect", "other.test", port, false, "", "no network.allow rule matches")
}

// ruleCase is one destination and the rules that decide it, for the table
// every explicit path is checked against.
type ruleCase struct {
	name        string
	allow, deny []string
	host        string
	port        uint16
	rule        string // the rule that decides, if any
	reason      string
	allowed     bool
	hint        string // in the 403 of a denial
}

// ruleCases is that table; p and q are the ports of two greeters the test
// started, so allowed cases reach a real upstream.
func ruleCases(p, q uint16) []ruleCase {
	hp := func(host string) string { return hostPort(host, p) }
	q1 := strconv.Quote
	up4 := upstream4.String()
	return []ruleCase{
		{"host:port allows that port", []string{hp("allowed.test")}, nil, "allowed.test", p, hp("allowed.test"), "allowed by", true, ""},
		{"host:port allows no other port", []string{hp("allowed.test")}, nil, "allowed.test", q, "", "no network.allow rule matches", false, hintAdd + q1(hostPort("allowed.test", q))},
		{"a name rule allows no other name", []string{hp("allowed.test")}, nil, "other.test", p, "", "no network.allow rule matches", false, hintAdd + q1(hp("other.test"))},
		{"a rule without a port allows 80 and 443 only", []string{"allowed.test"}, nil, "allowed.test", p, "", "no network.allow rule matches", false, hintAdd + q1(hp("allowed.test"))},
		{"wildcard allows a subdomain", []string{hp("*.wild.test")}, nil, "sub.wild.test", p, hp("*.wild.test"), "allowed by", true, ""},
		{"wildcard allows a deeper subdomain", []string{hp("*.wild.test")}, nil, "deep.sub.wild.test", p, hp("*.wild.test"), "allowed by", true, ""},
		{"wildcard does not allow the name itself", []string{hp("*.wild.test")}, nil, "wild.test", p, "", "no network.allow rule matches", false, hintAdd + q1(hp("wild.test"))},
		{"deny beats allow", []string{hp("*.corp.test")}, []string{hp("secret.corp.test")}, "secret.corp.test", p, hp("secret.corp.test"), "denied by network.deny", false,
			"it is denied by network.deny " + q1(hp("secret.corp.test")) + " in " + testProfile + ".\nRemoving that deny rule would allow it (network.allow " + q1(hp("*.corp.test")) + " matches)."},
		{"deny without an allow rule", nil, []string{hp("secret.corp.test")}, "secret.corp.test", p, hp("secret.corp.test"), "denied by network.deny", false,
			"it is denied by network.deny " + q1(hp("secret.corp.test")) + " in " + testProfile + ".\nTo allow it, remove that deny rule and add to network.allow (" + testProfile + "):\n    - " + q1(hp("secret.corp.test"))},
		{"deny leaves the rest allowed", []string{hp("*.corp.test")}, []string{hp("secret.corp.test")}, "api.corp.test", p, hp("*.corp.test"), "allowed by", true, ""},
		{"raw address without an address rule", []string{hp("allowed.test")}, nil, up4, p, "", "raw addresses are denied", false, hintAddress + q1(hp(up4))},
		{"address rule allows that address", []string{hp(up4)}, nil, up4, p, hp(up4), "allowed by", true, ""},
		{"metadata address", []string{hp("allowed.test")}, nil, "169.254.169.254", 80, "", "always denied", false, hintNever},
		{"loopback address", []string{hp("allowed.test")}, nil, "127.0.0.1", p, "", "loopback addresses are always denied", false, hintNever},
		{"engine API port", []string{"allowed.test"}, nil, "allowed.test", 2376, "", "the container engine's API port is always denied", false, hintNever},
	}
}

// TestCONNECTRules checks the rules through CONNECT to a raw TCP upstream.
func TestCONNECTRules(t *testing.T) {
	t.Parallel()
	p, _ := startGreeter(t, "tcp4")
	q, _ := startGreeter(t, "tcp4")
	tests := ruleCases(p, q)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := newExplicitGateway(t, tt.allow, tt.deny, nil)
			conn, br, resp := connectVia(t, g.http, hostPort(tt.host, tt.port), nil)
			if !tt.allowed {
				body := readBody(t, resp)
				if resp.StatusCode != 403 {
					t.Fatalf("CONNECT %s: %s %q, want 403", hostPort(tt.host, tt.port), resp.Status, body)
				}
				checkHint(t, body, tt.host, tt.port, tt.hint)
				if !strings.Contains(body, tt.reason) {
					t.Errorf("403 body %q does not say why (%q)", body, tt.reason)
				}
			} else {
				if resp.StatusCode != 200 {
					t.Fatalf("CONNECT %s: %s, want 200", hostPort(tt.host, tt.port), resp.Status)
				}
				greet(t, conn, br)
			}
			e := g.log.wait(t, 1)[0]
			checkEntry(t, e, "connect", tt.host, tt.port, tt.allowed, tt.rule, tt.reason)
			if tt.allowed && (e.BytesUp != 4 || e.BytesDown != int64(len(greeting))) {
				t.Errorf("bytes_up %d, bytes_down %d; want 4 and %d", e.BytesUp, e.BytesDown, len(greeting))
			}
		})
	}
}

// recordingDial is testDial, counting every call.
func recordingDial(calls *atomic.Int32) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		calls.Add(1)
		return testDial(ctx, network, addr)
	}
}

// TestRebinding: an allowed name that resolves to a metadata or loopback
// address is refused on every path, without dialing anything, and the log
// says why.
func TestRebinding(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"rebind.test", "mixed.test", "mapped.test", "aws6.test", "loop.test", "loop6.test"} {
		for _, via := range []string{"http", "connect", "socks5"} {
			t.Run(name+"/"+via, func(t *testing.T) {
				t.Parallel()
				var calls atomic.Int32
				g := newExplicitGateway(t, []string{name}, nil, func(c *Config) { c.Dial = recordingDial(&calls) })
				target := hostPort(name, 443)
				switch via {
				case "http":
					target = hostPort(name, 80)
					resp, err := proxyClient(t, g, nil).Get("http://" + name + "/")
					if err != nil {
						t.Fatal(err)
					}
					if body := readBody(t, resp); resp.StatusCode != 403 || !strings.Contains(body, "never connects") {
						t.Errorf("%s %q, want 403 saying the gateway never connects there", resp.Status, body)
					}
				case "connect":
					_, _, resp := connectVia(t, g.http, target, nil)
					if body := readBody(t, resp); resp.StatusCode != 403 || !strings.Contains(body, "always denied") {
						t.Errorf("%s %q, want 403 saying why", resp.Status, body)
					}
				case "socks5":
					if _, err := socksDial(t, g.socks, target); err == nil || !strings.Contains(err.Error(), "not allowed by ruleset") {
						t.Errorf("SOCKS5 CONNECT %s: %v, want connection not allowed by ruleset", target, err)
					}
				}
				if n := calls.Load(); n != 0 {
					t.Errorf("the gateway dialed %d times, want none", n)
				}
				e := g.log.wait(t, 1)[0]
				_, port, _ := splitHostPort(target)
				checkEntry(t, e, via, name, port, false, "", "always denied")
				if !strings.Contains(e.Reason, "resolves to") || !strings.Contains(e.Reason, `allowed by network.allow "`+name+`"`) {
					t.Errorf("reason %q should say the rule allowed the name and what it resolved to", e.Reason)
				}
			})
		}
	}
}

// TestOwnAddress: an allowed name that resolves to an address the gateway
// listens on is refused without dialing (the gateway would connect to its own
// listeners, in a loop).
func TestOwnAddress(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"connect", "socks5"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			g := newExplicitGateway(t, []string{"self.test", "allowed.test"}, nil, func(c *Config) {
				c.Dial = recordingDial(&calls)
				c.addOwn(ownAddr)
			})
			target := hostPort("self.test", 443)
			if via == "connect" {
				_, _, resp := connectVia(t, g.http, target, nil)
				if body := readBody(t, resp); resp.StatusCode != 403 || !strings.Contains(body, "self.test resolves to 192.0.2.9: the gateway's own address is always denied") {
					t.Errorf("%s %q, want 403 saying why", resp.Status, body)
				}
			} else if _, err := socksDial(t, g.socks, target); err == nil || !strings.Contains(err.Error(), "not allowed by ruleset") {
				t.Errorf("SOCKS5 CONNECT %s: %v, want connection not allowed by ruleset", target, err)
			}
			if n := calls.Load(); n != 0 {
				t.Errorf("the gateway dialed %d times, want none", n)
			}
			checkEntry(t, g.log.wait(t, 1)[0], via, "self.test", 443, false, "", "the gateway's own address is always denied")
		})
	}
}

// TestCONNECTByteCounts moves known payloads through a tunnel to a raw TCP
// upstream; the log counts exactly the bytes of each direction. The eager
// client sends its payload right behind the CONNECT request, before the 200.
func TestCONNECTByteCounts(t *testing.T) {
	t.Parallel()
	const upSize, downSize = 1 << 20, 256<<10 + 7
	for _, eager := range []bool{false, true} {
		t.Run(fmt.Sprintf("eager=%v", eager), func(t *testing.T) {
			t.Parallel()
			payload := bytes.Repeat([]byte("0123456789abcdef"), upSize/16)
			received := make(chan []byte, 1)
			port := startTCP(t, "tcp4", func(conn net.Conn) {
				b, _ := io.ReadAll(conn)
				received <- b
				conn.Write(bytes.Repeat([]byte{'d'}, downSize))
			})
			g := newExplicitGateway(t, []string{hostPort("allowed.test", port)}, nil, nil)
			var extra []byte
			if eager {
				extra = payload
			}
			conn, br, resp := connectVia(t, g.http, hostPort("allowed.test", port), extra)
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT: %s", resp.Status)
			}
			if !eager {
				if _, err := conn.Write(payload); err != nil {
					t.Fatal(err)
				}
			}
			conn.(*net.TCPConn).CloseWrite()
			down, err := io.ReadAll(br)
			if err != nil || len(down) != downSize {
				t.Fatalf("read %d bytes, %v; want %d", len(down), err, downSize)
			}
			if got := <-received; !bytes.Equal(got, payload) {
				t.Fatalf("the upstream received %d bytes, not the %d of the payload", len(got), len(payload))
			}
			e := g.log.wait(t, 1)[0]
			if e.BytesUp != upSize || e.BytesDown != downSize {
				t.Errorf("bytes_up %d, bytes_down %d; want %d and %d", e.BytesUp, e.BytesDown, upSize, downSize)
			}
		})
	}
}

// TestUnreachable: an allowed destination that does not answer (or resolve)
// is a 502 or a SOCKS5 failure, logged as allowed with the error.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	closed := closedPort(t)
	tests := []struct {
		name, host string
		port       uint16
		socksErr   string
	}{
		{"refused", "allowed.test", closed, "connection refused"},
		{"unresolvable", "nowhere.test", 443, "host unreachable"},
	}
	for _, tt := range tests {
		for _, via := range []string{"connect", "socks5"} {
			t.Run(tt.name+"/"+via, func(t *testing.T) {
				t.Parallel()
				target := hostPort(tt.host, tt.port)
				g := newExplicitGateway(t, []string{target}, nil, nil)
				if via == "connect" {
					_, _, resp := connectVia(t, g.http, target, nil)
					if body := readBody(t, resp); resp.StatusCode != 502 {
						t.Errorf("CONNECT %s: %s %q, want 502", target, resp.Status, body)
					}
				} else if _, err := socksDial(t, g.socks, target); err == nil || !strings.Contains(err.Error(), tt.socksErr) {
					t.Errorf("SOCKS5 CONNECT %s: %v, want %q", target, err, tt.socksErr)
				}
				e := g.log.wait(t, 1)[0]
				checkEntry(t, e, via, tt.host, tt.port, true, target, "allowed")
				if e.Error == "" {
					t.Errorf("log entry %+v has no error", e)
				}
			})
		}
	}
}

// TestPanicRecovered: a connection whose handling panics is closed and
// logged; the server goes on serving.
func TestPanicRecovered(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"http", "socks5"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			p, _ := startGreeter(t, "tcp4")
			g := newExplicitGateway(t, []string{hostPort("boom.test", p), hostPort("allowed.test", p)}, nil, nil)
			if via == "http" {
				conn, err := net.DialTimeout("tcp", g.http, ioTimeout)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(ioTimeout))
				fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\n\r\n", hostPort("boom.test", p))
				if b, err := io.ReadAll(conn); len(b) != 0 || err != nil {
					t.Errorf("read %q, %v; want the connection closed", b, err)
				}
				conn, br, resp := connectVia(t, g.http, hostPort("allowed.test", p), nil)
				if resp.StatusCode != 200 {
					t.Fatalf("CONNECT after a panic: %s", resp.Status)
				}
				greet(t, conn, br)
			} else {
				if _, err := socksDial(t, g.socks, hostPort("boom.test", p)); err == nil {
					t.Error("SOCKS5 CONNECT boom.test succeeded")
				}
				conn, err := socksDial(t, g.socks, hostPort("allowed.test", p))
				if err != nil {
					t.Fatalf("SOCKS5 CONNECT after a panic: %v", err)
				}
				greet(t, conn, bufio.NewReader(conn))
			}
			entries := g.log.wait(t, 2)
			if e := entries[0]; e.Via != via || e.Allowed || !strings.Contains(e.Error, "panic: resolver exploded") {
				t.Errorf("log entry %+v, want the panic", e)
			}
			if !entries[1].Allowed {
				t.Errorf("log entry %+v, want the connection after the panic allowed", entries[1])
			}
		})
	}
}

// TestServeShutdown: closing the listener ends Serve promptly with nil, and
// closes the connections it accepted, idle or relaying (which are logged).
func TestServeShutdown(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"connect", "socks5"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			p, _ := startGreeter(t, "tcp4")
			log := &entryLog{}
			c := &Config{Policy: mustPolicy(t, hostPort("allowed.test", p)), Resolve: resolveTestNames, Dial: testDial, Log: decisionlog.NewWriter(log)}
			serve := c.ServeHTTPProxy
			if via == "socks5" {
				serve = c.ServeSOCKS
			}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- serve(l) }()

			idle, err := net.DialTimeout("tcp", l.Addr().String(), ioTimeout)
			if err != nil {
				t.Fatal(err)
			}
			defer idle.Close()
			var (
				relaying net.Conn
				r        io.Reader
			)
			if via == "connect" {
				var resp *http.Response
				relaying, r, resp = connectVia(t, l.Addr().String(), hostPort("allowed.test", p), nil)
				if resp.StatusCode != 200 {
					t.Fatalf("CONNECT: %s", resp.Status)
				}
			} else if relaying, err = socksDial(t, l.Addr().String(), hostPort("allowed.test", p)); err != nil {
				t.Fatal(err)
			} else {
				r = relaying
			}
			if _, err := io.ReadFull(r, make([]byte, len(greeting))); err != nil {
				t.Fatal(err)
			}

			l.Close()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Serve returned %v, want nil", err)
				}
			case <-time.After(ioTimeout):
				t.Fatalf("Serve did not return within %v", ioTimeout)
			}
			for name, conn := range map[string]net.Conn{"idle": idle, "relaying": relaying} {
				conn.SetDeadline(time.Now().Add(ioTimeout))
				if _, err := conn.Read(make([]byte, 1)); err == nil {
					t.Errorf("the %s connection is still open after Serve returned", name)
				}
			}
			if e := log.wait(t, 1)[0]; !e.Allowed || e.BytesDown != int64(len(greeting)) {
				t.Errorf("log entry %+v, want the relay with its bytes", e)
			}
		})
	}
}

// TestHandshakeTimeout: a client that says nothing is dropped once the
// handshake deadline passes.
func TestHandshakeTimeout(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"http", "socks5"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			c := &Config{Resolve: resolveTestNames, Log: decisionlog.NewWriter(&entryLog{})}
			h := c.serveHTTPConn
			if via == "socks5" {
				h = c.serveSOCKSConn
			}
			addr := startServing(t, func(l net.Listener) error { return c.serve(l, via, 50*time.Millisecond, h) })
			conn, err := net.DialTimeout("tcp", addr, ioTimeout)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(ioTimeout))
			start := time.Now()
			if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read %v after %v; want the gateway to close a silent client", err, time.Since(start))
			}
		})
	}
}

func TestServeNeedsLog(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := new(Config).ServeHTTPProxy(l); err == nil || !strings.Contains(err.Error(), "Log is required") {
		t.Errorf("Serve without a Log: %v, want an error", err)
	}
}

func mustPolicy(t *testing.T, allow ...string) egress.Policy {
	t.Helper()
	p, err := egress.ParsePolicy(allow, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
