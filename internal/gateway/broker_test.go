package gateway

// Tests of the connections the gateway opens: brokered secrets and limited
// requests, over CONNECT, SOCKS5, the transparent TLS path and plain HTTP,
// against TLS upstreams on loopback whose certificates a test CA signed.

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/broker"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
	"github.com/propio/propio-sandbox/internal/testenv/zeros"
)

const (
	realValue = "sk-real-0123456789abcdef"
	gitValue  = "ghp_realgitvalue42"
)

// brokerUpstream is a TLS server (HTTP/1.1 and HTTP/2) for llm.test,
// git.test, api.test and free.test, its certificate signed by a CA of its
// own, that keeps the headers of every request it gets.
type brokerUpstream struct {
	srv   *httptest.Server
	roots *x509.CertPool // its CA
	port  uint16

	mu   sync.Mutex
	seen []seenRequest
	// release, when a server-sent events stream waits on it, lets the second
	// event go.
	release chan struct{}
}

type seenRequest struct {
	proto, method, host, path, auth string
}

func startBrokerUpstream(t testing.TB) *brokerUpstream {
	t.Helper()
	u := &brokerUpstream{release: make(chan struct{})}
	iss := testIssuer(t, "llm.test", "git.test", "api.test", "free.test")
	u.roots = x509.NewCertPool()
	u.roots.AddCert(iss.CA())
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.srv.EnableHTTP2 = true
	u.srv.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return iss.Certificate(h.ServerName) }}
	u.srv.StartTLS()
	t.Cleanup(u.srv.Close)
	u.port = serverPort(t, u.srv)
	return u
}

func (u *brokerUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.seen = append(u.seen, seenRequest{proto: r.Proto, method: r.Method, host: r.Host, path: r.URL.Path, auth: r.Header.Get("Authorization")})
	u.mu.Unlock()
	if n, ok := strings.CutPrefix(r.URL.Path, "/bytes/"); ok {
		zeros.Serve(w, r, n)
		return
	}
	switch r.URL.Path {
	case "/early": // the credential echoed in an informational response first
		w.Header().Set("Link", r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		fmt.Fprint(w, "done")
	case "/echo": // a careless server that echoes the credential
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "you sent %s", r.Header.Get("Authorization"))
	case "/upgrade": // an upgrade to an echo of lines, as a WebSocket would be
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "no upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				return
			}
			brw.WriteString("echo " + line)
			brw.Flush()
		}
	case "/sse":
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: second\n\n")
	default:
		fmt.Fprintf(w, "%s %s %s", r.Proto, r.Method, r.URL.Path)
	}
}

// last is the last request the upstream got.
func (u *brokerUpstream) last(t *testing.T) seenRequest {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.seen) == 0 {
		t.Fatal("the upstream got no request")
	}
	return u.seen[len(u.seen)-1]
}

// testIssuer is a run's CA for the hosts given.
func testIssuer(t testing.TB, hosts ...string) *broker.Issuer {
	t.Helper()
	iss, err := broker.NewIssuer(hosts, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// brokerGateway is a gateway with the explicit proxies and the TLS
// listener, brokering LLM_TOKEN to llm.test and GIT_TOKEN to git.test,
// allowing api.test for GET and HEAD only, and free.test whole.
type brokerGateway struct {
	*explicitGateway
	up       *brokerUpstream
	tlsAddr  string         // the transparent TLS listener
	runRoots *x509.CertPool // the run's CA, as the sandbox trusts it
	sentinel map[string]string
}

func startBrokerGateway(t testing.TB, load bool) *brokerGateway {
	t.Helper()
	return startBrokerGatewayOn(t, startBrokerUpstream(t), load)
}

// startBrokerGatewayOn is startBrokerGateway on an upstream of the caller's.
func startBrokerGatewayOn(t testing.TB, up *brokerUpstream, load bool) *brokerGateway {
	t.Helper()
	p := fmt.Sprint(up.port)
	b := &brokerGateway{up: up, sentinel: map[string]string{"LLM_TOKEN": broker.NewSentinel("LLM_TOKEN"), "GIT_TOKEN": broker.NewSentinel("GIT_TOKEN")}}
	iss := testIssuer(t, "llm.test", "git.test", "api.test")
	run := broker.Run{Secrets: []broker.Secret{{Name: "LLM_TOKEN", Sentinel: b.sentinel["LLM_TOKEN"], Value: realValue}, {Name: "GIT_TOKEN", Sentinel: b.sentinel["GIT_TOKEN"], Value: gitValue}}}
	b.explicitGateway = newExplicitGateway(t, []string{"llm.test:" + p, "git.test:" + p, "free.test:" + p, "other.test:" + p}, nil, func(c *Config) {
		api, err := egress.ParseFlagRule("api.test:" + p + " GET,HEAD")
		if err != nil {
			t.Fatal(err)
		}
		c.Policy.Allow = append(c.Policy.Allow, api)
		c.Secrets = []SecretHosts{{Name: "LLM_TOKEN", Hosts: rules(t, "llm.test:"+p)}, {Name: "GIT_TOKEN", Hosts: rules(t, "git.test:"+p)}}
		c.UpstreamRoots = up.roots
		c.Resolve = resolveBrokerNames
		c.Issuer = iss
		if load {
			if err := c.SetRun(run); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Cleanup(b.cfg.stopIntercepting)
	b.tlsAddr = startServing(t, func(l net.Listener) error { return b.cfg.ServeTLS(l, up.port) })
	b.runRoots = x509.NewCertPool()
	b.runRoots.AddCert(iss.CA())
	return b
}

// resolveBrokerNames resolves the broker tests' names to upstream4.
func resolveBrokerNames(ctx context.Context, host string) ([]netip.Addr, error) {
	switch host {
	case "llm.test", "git.test", "api.test", "free.test":
		return []netip.Addr{upstream4}, nil
	}
	return resolveTestNames(ctx, host)
}

func rules(t testing.TB, texts ...string) []egress.Rule {
	t.Helper()
	var out []egress.Rule
	for _, s := range texts {
		r, err := egress.ParseRule(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// client is an HTTP client through the CONNECT proxy that trusts roots;
// h2 lets it speak HTTP/2.
func (b *brokerGateway) client(t *testing.T, roots *x509.CertPool, h2 bool) *http.Client {
	t.Helper()
	tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: b.http}), TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: h2}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: ioTimeout}
}

func (b *brokerGateway) url(host, path string) string {
	return "https://" + host + ":" + fmt.Sprint(b.up.port) + path
}

func do(t *testing.T, c *http.Client, method, url string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return resp, string(body)
}

// request is the log entry of the request to host path, as the gateway
// wrote it once the request ended.
func (b *brokerGateway) request(t *testing.T, host, path string) decisionlog.Entry {
	t.Helper()
	deadline := time.Now().Add(ioTimeout)
	for {
		for _, e := range b.log.entries(t) {
			if e.Host == host && e.Path == path && e.Method != "" {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request entry for %s%s: %+v", host, path, b.log.entries(t))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBrokerPutsTheValueIn: through CONNECT, over HTTP/1.1 and HTTP/2, the
// sentinel becomes the real value in requests to the host its secret names,
// wherever it is in a header and inside a Basic credential; a value the
// upstream echoes comes back masked; the log names the secret, never its
// value.
func TestBrokerPutsTheValueIn(t *testing.T) {
	t.Parallel()
	b := startBrokerGateway(t, true)
	s := b.sentinel["LLM_TOKEN"]
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			c := b.client(t, b.runRoots, h2)
			resp, body := do(t, c, "GET", b.url("llm.test", "/echo"), http.Header{"Authorization": {"Bearer " + s}})
			got := b.up.last(t)
			if got.auth != "Bearer "+realValue {
				t.Errorf("the upstream got Authorization %q, want the real value", got.auth)
			}
			wantProto := "HTTP/1.1"
			if h2 {
				wantProto = "HTTP/2.0"
			}
			if resp.Proto != wantProto || got.proto != wantProto {
				t.Errorf("the client spoke %s, the upstream got %s; want %s end to end", resp.Proto, got.proto, wantProto)
			}
			mask := maskFor("LLM_TOKEN")
			if strings.Contains(body+resp.Header.Get("X-Echo"), realValue) || body != "you sent Bearer "+mask || resp.Header.Get("X-Echo") != "Bearer "+mask {
				t.Errorf("the echo reached the client as %q (X-Echo %q): want the value masked", body, resp.Header.Get("X-Echo"))
			}
		})
	}
	e := b.request(t, "llm.test", "/echo")
	if e.Via != "https" || !e.Allowed || e.Status != 200 || !slices.Equal(e.Secrets, []string{"LLM_TOKEN"}) || !slices.Equal(e.Masked, []string{"LLM_TOKEN"}) {
		t.Errorf("request entry %+v, want via https, 200, LLM_TOKEN put in and masked", e)
	}
	if conn := b.log.waitFor(t, "connect", "llm.test"); !conn.Allowed || conn.BytesUp == 0 || conn.BytesDown == 0 {
		t.Errorf("connection entry %+v, want allowed with bytes", conn)
	}

	t.Run("informational", func(t *testing.T) {
		c := b.client(t, b.runRoots, false)
		var early []string
		req, _ := http.NewRequest("GET", b.url("llm.test", "/early"), nil)
		req.Header.Set("Authorization", "Bearer "+s)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				early = append(early, fmt.Sprint(code, " ", h.Get("Link")))
				return nil
			},
		}))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := []string{"103 Bearer " + maskFor("LLM_TOKEN")}; !slices.Equal(early, want) {
			t.Errorf("the informational responses reached the client as %q, want %q", early, want)
		}
	})
	t.Run("basic", func(t *testing.T) {
		c := b.client(t, b.runRoots, false)
		cred := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + s))
		do(t, c, "GET", b.url("llm.test", "/basic"), http.Header{"Authorization": {"Basic " + cred}})
		want := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+realValue))
		if got := b.up.last(t).auth; got != want {
			t.Errorf("the upstream got %q, want the real value inside the Basic credential", got)
		}
	})
	if strings.Contains(b.logText(), realValue) || strings.Contains(b.logText(), gitValue) {
		t.Errorf("the log holds a real value:\n%s", b.logText())
	}
}

func (b *brokerGateway) logText() string { return b.log.String() }

// TestBrokerLeavesOtherSentinels: a sentinel sent to a host its secret does
// not name leaves as it is, in the headers or the URL, and is logged; so
// does one in a plain HTTP request through the proxy to any host.
func TestBrokerLeavesOtherSentinels(t *testing.T) {
	t.Parallel()
	b := startBrokerGateway(t, true)
	s := b.sentinel["LLM_TOKEN"]
	c := b.client(t, b.runRoots, false)
	do(t, c, "GET", b.url("git.test", "/x?token="+s), http.Header{"Authorization": {"Bearer " + s}, "X-Other": {b.sentinel["GIT_TOKEN"]}})
	if got := b.up.last(t); got.auth != "Bearer "+s {
		t.Errorf("git.test got %q, want LLM_TOKEN's sentinel as it was sent", got.auth)
	}
	e := b.request(t, "git.test", "/x")
	if !slices.Equal(e.Sentinels, []string{"LLM_TOKEN"}) || !slices.Equal(e.Secrets, []string{"GIT_TOKEN"}) {
		t.Errorf("entry %+v, want LLM_TOKEN's sentinel left, GIT_TOKEN put in", e)
	}

	// Plain HTTP through the proxy, to a host no secret names.
	plain := startHTTPUpstream(t, false)
	g := newExplicitGateway(t, []string{hostPort("allowed.test", serverPort(t, plain))}, nil, func(cfg *Config) {
		cfg.Secrets = b.cfg.Secrets
		run := broker.Run{Secrets: []broker.Secret{{Name: "LLM_TOKEN", Sentinel: s, Value: realValue}}}
		if err := cfg.SetRun(run); err == nil {
			t.Fatal("SetRun took a run though the gateway has no CA")
		}
		cfg.Issuer = testIssuer(t, "llm.test")
		if err := cfg.SetRun(run); err != nil {
			t.Fatal(err)
		}
	})
	resp, body := do(t, proxyClient(t, g, nil), "GET", "http://allowed.test:"+fmt.Sprint(serverPort(t, plain))+"/headers", http.Header{"X-Key": {s}})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	pe := g.log.waitFor(t, "http", "allowed.test")
	if !slices.Equal(pe.Sentinels, []string{"LLM_TOKEN"}) || len(pe.Secrets) != 0 {
		t.Errorf("plain request entry %+v, want LLM_TOKEN's sentinel left", pe)
	}
}

// TestBrokerLimits: a rule's methods refuse the others with a 403 that says
// why and where; a request for another host than its connection's is
// refused; a host with neither secrets nor limits passes through untouched,
// its own certificate and all.
func TestBrokerLimits(t *testing.T) {
	t.Parallel()
	b := startBrokerGateway(t, true)
	c := b.client(t, b.runRoots, false)
	resp, body := do(t, c, "GET", b.url("api.test", "/repos"), nil)
	if resp.StatusCode != 200 || body != "HTTP/1.1 GET /repos" {
		t.Errorf("GET on api.test: %d %q", resp.StatusCode, body)
	}
	resp, body = do(t, c, "POST", b.url("api.test", "/repos"), nil)
	if resp.StatusCode != 403 || !strings.Contains(body, `POST api.test:`+fmt.Sprint(b.up.port)+`/repos is not allowed (network.allow "api.test:`) ||
		!strings.Contains(body, "allows GET, HEAD only") || !strings.Contains(body, testProfile) {
		t.Errorf("POST on api.test: %d %q, want a 403 naming the rule and the profile", resp.StatusCode, body)
	}
	if e := b.request(t, "api.test", "/repos"); e.Method != "GET" || !e.Allowed {
		t.Errorf("first entry %+v, want the GET allowed", e)
	}

	req, _ := http.NewRequest("GET", b.url("llm.test", "/"), nil)
	req.Host = "evil.test"
	resp2, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp2.Body)
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("a request for evil.test on llm.test's connection: %d, want 421", resp2.StatusCode)
	}

	// free.test is passed through: the client sees the upstream's
	// certificate, which the run's CA did not sign.
	up := b.client(t, b.up.roots, false)
	resp, body = do(t, up, "POST", b.url("free.test", "/any"), nil)
	if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.PeerCertificates[0].CheckSignatureFrom(resp.TLS.PeerCertificates[len(resp.TLS.PeerCertificates)-1]) != nil {
		t.Errorf("free.test: %d %q", resp.StatusCode, body)
	}
	if _, err := b.client(t, b.runRoots, false).Get(b.url("free.test", "/")); err == nil {
		t.Error("free.test's TLS was terminated by the gateway: it should pass through")
	}
}

// TestBrokerUpstreamVerified: an upstream whose certificate the gateway
// does not trust is refused with a 502 that says so, never carried.
func TestBrokerUpstreamVerified(t *testing.T) {
	t.Parallel()
	b := startBrokerGateway(t, true)
	b.cfg.UpstreamRoots = x509.NewCertPool() // trusts nothing
	b.cfg.stopIntercepting()
	b.cfg.iceptOnce = sync.Once{}
	b.cfg.icept = nil
	resp, body := do(t, b.client(t, b.runRoots, false), "GET", b.url("llm.test", "/untrusted"), http.Header{"Authorization": {"Bearer " + b.sentinel["LLM_TOKEN"]}})
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "the upstream's certificate is not trusted") {
		t.Errorf("%d %q, want a 502 about the upstream's certificate", resp.StatusCode, body)
	}
	b.up.mu.Lock()
	n := len(b.up.seen)
	b.up.mu.Unlock()
	if n != 0 {
		t.Errorf("the upstream got %d requests through an unverified connection", n)
	}
	if e := b.request(t, "llm.test", "/untrusted"); !strings.Contains(e.Error, "not trusted") {
		t.Errorf("entry %+v, want the error", e)
	}
}

// TestBrokerStreams: a server-sent events stream reaches the client event
// by event: the first arrives before the upstream sends the second.
func TestBrokerStreams(t *testing.T) {
	t.Parallel()
	b := startBrokerGateway(t, true)
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			b.up.release = make(chan struct{})
			resp, err := b.client(t, b.runRoots, h2).Get(b.url("llm.test", "/sse"))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			if err != nil || line != "data: first\n" {
				t.Fatalf("first event %q, %v", line, err)
			}
			close(b.up.release)
			rest, _ := io.ReadAll(br)
			if string(rest) != "\ndata: second\n\n" {
				t.Errorf("after the first event: %q", rest)
			}
		})
	}
}

// TestBrokerWaysIn: the transparent TLS path and SOCKS5 open the
// connection as CONNECT does; without a run's CA, none is opened.
func TestBrokerWaysIn(t *testing.T) {
	t.Parallel()
	b := startBrokerGateway(t, true)
	s := b.sentinel["LLM_TOKEN"]
	sni := &http.Client{Timeout: ioTimeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", b.tlsAddr)
		},
		TLSClientConfig: &tls.Config{RootCAs: b.runRoots},
	}}
	do(t, sni, "GET", b.url("llm.test", "/sni"), http.Header{"Authorization": {"Bearer " + s}})
	if got := b.up.last(t); got.auth != "Bearer "+realValue || got.path != "/sni" {
		t.Errorf("through the TLS listener the upstream got %+v", got)
	}
	socks := &http.Client{Timeout: ioTimeout, Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "socks5h", Host: b.socks}),
		TLSClientConfig: &tls.Config{RootCAs: b.runRoots},
	}}
	do(t, socks, "GET", b.url("llm.test", "/socks"), http.Header{"Authorization": {"Bearer " + s}})
	if got := b.up.last(t); got.auth != "Bearer "+realValue || got.path != "/socks" {
		t.Errorf("through SOCKS5 the upstream got %+v", got)
	}

	none := startBrokerGateway(t, false)
	if _, err := none.client(t, none.runRoots, false).Get(none.url("llm.test", "/")); err == nil {
		t.Error("a gateway without the run's CA opened a connection")
	}
	if e := none.log.waitFor(t, "connect", "llm.test"); !strings.Contains(e.Error, "no CA for this run") {
		t.Errorf("entry %+v, want the missing CA", e)
	}
}

// chunked reads s n bytes at a time.
type chunked struct {
	s string
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), c.n)], c.s)
	c.s = c.s[k:]
	return k, nil
}

// TestOpenedNamesNotForwarded: a name a secret may go to, or whose
// requests are limited, gets no virtual address: the kernel would carry its
// bytes past the gateway, which must see them. Its DNS answer is the
// gateway's own address.
func TestOpenedNamesNotForwarded(t *testing.T) {
	t.Parallel()
	k := &fakeKernel{}
	c, _ := kernelConfig(t, k, "10.99.0.128/25")
	c.Secrets = []SecretHosts{{Name: "T", Hosts: rules(t, "allowed.test")}}
	limited, err := egress.ParseFlagRule("ssh.test:22 GET")
	if err != nil {
		t.Fatal(err)
	}
	c.Policy.Allow = slices.DeleteFunc(c.Policy.Allow, func(r egress.Rule) bool { return r.Text == "ssh.test:22" })
	c.Policy.Allow = append(c.Policy.Allow, limited)
	ctx := context.Background()
	for _, name := range []string{"allowed.test", "ssh.test"} {
		if v, ok, err := c.virtualAnswer(ctx, name); ok || err != nil {
			t.Errorf("%s: %v %v %v, want the gateway's own address", name, v, ok, err)
		}
	}
	if v, ok, err := c.virtualAnswer(ctx, "a.wild.test"); !ok || err != nil {
		t.Errorf("a.wild.test: %v %v %v, want a virtual address: nothing to see there", v, ok, err)
	}
	if len(k.forwards) != 1 {
		t.Errorf("the kernel forwards %v, want a.wild.test alone", k.forwards)
	}
}

// TestBrokerPlainHTTP: on the transparent HTTP path (port 80, routed by
// Host), a request that carries the sentinel of a secret whose host it is
// gets a 403 saying to use https, and nothing reaches the upstream; when the
// profile lets the value go to the host in clear (cleartext_hosts), the
// sentinel becomes its value in each request of the connection, and the
// response is masked.
func TestBrokerPlainHTTP(t *testing.T) {
	t.Parallel()
	for _, cleartext := range []bool{false, true} {
		t.Run(fmt.Sprintf("cleartext=%v", cleartext), func(t *testing.T) {
			t.Parallel()
			got := make(chan string, 2)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got <- r.Header.Get("X-Key")
				fmt.Fprintf(w, "X-Key was %s", r.Header.Get("X-Key"))
			}))
			t.Cleanup(up.Close)
			n := &loopbackNet{names: map[string][]netip.Addr{"llm.test": upstreamAddrs}, port: portOf(t, up.URL)}
			c, log := newTransparentConfig(t, []string{"llm.test"}, nil, n)
			c.Secrets = []SecretHosts{{Name: "LLM_TOKEN", Hosts: rules(t, "llm.test")}}
			if cleartext {
				c.Secrets[0].Cleartext = rules(t, "llm.test")
			}
			s := broker.NewSentinel("LLM_TOKEN")
			c.Issuer = testIssuer(t, "llm.test")
			if err := c.SetRun(broker.Run{Secrets: []broker.Secret{{Name: "LLM_TOKEN", Sentinel: s, Value: realValue}}}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.stopIntercepting)
			gw := startServing(t, func(l net.Listener) error { return c.ServeHostHTTP(l, 80) })
			client := &http.Client{Timeout: ioTimeout, Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, "tcp", gw)
				},
			}}
			if !cleartext {
				resp, body := do(t, client, "GET", "http://llm.test/headers", http.Header{"X-Key": {"k=" + s}})
				if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "over TLS only: nothing was sent") ||
					!strings.Contains(body, "Use https://llm.test/headers") || !strings.Contains(body, "secrets.LLM_TOKEN.cleartext_hosts") {
					t.Errorf("plain HTTP with a sentinel: %d %q, want a 403 saying to use https", resp.StatusCode, body)
				}
				if resp, body := do(t, client, "GET", "http://llm.test/free", nil); resp.StatusCode != 200 || <-got != "" {
					t.Errorf("plain HTTP without a sentinel: %d %q, want it through", resp.StatusCode, body)
				}
				select {
				case v := <-got:
					t.Errorf("the upstream got a request with X-Key %q", v)
				default:
				}
				e := requestEntries(t, log, 2)[0]
				if e.Allowed || e.Status != 403 || !slices.Equal(e.Sentinels, []string{"LLM_TOKEN"}) || len(e.Secrets) > 0 ||
					e.Reason != "LLM_TOKEN may go to llm.test over TLS only, and this request is plain HTTP" {
					t.Errorf("request entry %+v, want refused, the sentinel left", e)
				}
				return
			}
			for i := range 2 { // two requests on one connection: both are seen
				resp, body := do(t, client, "GET", "http://llm.test/headers", http.Header{"X-Key": {"k=" + s}})
				if resp.StatusCode != 200 || body != "X-Key was k="+maskFor("LLM_TOKEN") {
					t.Fatalf("request %d: %d %q, want the echo masked", i, resp.StatusCode, body)
				}
				if v := <-got; v != "k="+realValue {
					t.Errorf("request %d: the upstream got %q, want the real value", i, v)
				}
			}
			if reqs := requestEntries(t, log, 2); reqs[1].Via != "http" || !slices.Equal(reqs[1].Secrets, []string{"LLM_TOKEN"}) {
				t.Errorf("request entries %+v, want two, each with LLM_TOKEN put in", reqs)
			}
		})
	}
}

// requestEntries waits for n request entries in log, and returns them.
func requestEntries(t *testing.T, log *entryLog, n int) []decisionlog.Entry {
	t.Helper()
	var reqs []decisionlog.Entry
	deadline := time.Now().Add(ioTimeout)
	for len(reqs) < n && time.Now().Before(deadline) {
		reqs = slices.DeleteFunc(log.entries(t), func(e decisionlog.Entry) bool { return e.Method == "" })
		time.Sleep(5 * time.Millisecond)
	}
	if len(reqs) != n {
		t.Fatalf("request entries %+v, want %d", reqs, n)
	}
	return reqs
}

// TestBrokerUpgrade: a connection upgraded on a secret's host (as a
// WebSocket is) carries bytes both ways after the 101, the value put in the
// request that upgraded it.
func TestBrokerUpgrade(t *testing.T) {
	t.Parallel()
	b := startBrokerGateway(t, true)
	conn, _, resp := connectVia(t, b.http, hostPort("llm.test", b.up.port), nil)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	tc := tls.Client(conn, &tls.Config{ServerName: "llm.test", RootCAs: b.runRoots, NextProtos: []string{"http/1.1"}})
	tc.SetDeadline(time.Now().Add(ioTimeout))
	fmt.Fprintf(tc, "GET /upgrade HTTP/1.1\r\nHost: llm.test:%d\r\nConnection: Upgrade\r\nUpgrade: echo\r\nAuthorization: Bearer %s\r\n\r\n", b.up.port, b.sentinel["LLM_TOKEN"])
	tr := bufio.NewReader(tc)
	up, err := http.ReadResponse(tr, nil)
	if err != nil || up.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", up, err)
	}
	fmt.Fprint(tc, "ping\n")
	if line, err := tr.ReadString('\n'); err != nil || line != "echo ping\n" {
		t.Fatalf("after the upgrade: %q %v", line, err)
	}
	if got := b.up.last(t); got.path != "/upgrade" || got.auth != "Bearer "+realValue {
		t.Errorf("the upgrade request reached the upstream as %+v", got)
	}
}

// TestBrokerProxyPlainHTTP: through the proxy, a plain HTTP request that
// carries the sentinel of a secret whose host it is gets a 403 and reaches
// nothing; where cleartext_hosts lets it, the value goes, and the answer,
// gzipped though the gateway asked for identity, comes back decoded and
// masked, with no length, twice in a row.
func TestBrokerProxyPlainHTTP(t *testing.T) {
	t.Parallel()
	got := make(chan string, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("X-Key") + " " + r.Header.Get("Accept-Encoding")
		zw := gzip.NewWriter(w)
		w.Header().Set("Content-Encoding", "gzip")
		fmt.Fprintf(zw, "X-Key was %s", r.Header.Get("X-Key"))
		zw.Close()
	}))
	t.Cleanup(up.Close)
	host := hostPort("llm.test", serverPort(t, up))
	for _, cleartext := range []bool{false, true} {
		t.Run(fmt.Sprintf("cleartext=%v", cleartext), func(t *testing.T) {
			t.Parallel()
			s := broker.NewSentinel("LLM_TOKEN")
			g := newExplicitGateway(t, []string{host}, nil, func(c *Config) {
				c.Secrets = []SecretHosts{{Name: "LLM_TOKEN", Hosts: rules(t, host)}}
				if cleartext {
					c.Secrets[0].Cleartext = rules(t, host)
				}
				c.Resolve = resolveBrokerNames
				c.Issuer = testIssuer(t, "llm.test")
				if err := c.SetRun(broker.Run{Secrets: []broker.Secret{{Name: "LLM_TOKEN", Sentinel: s, Value: realValue}}}); err != nil {
					t.Fatal(err)
				}
			})
			client := proxyClient(t, g, nil)
			if !cleartext {
				resp, body := do(t, client, "GET", "http://"+host+"/plain", http.Header{"X-Key": {s}})
				if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "over TLS only: nothing was sent") {
					t.Errorf("%d %q, want a 403 saying to use https", resp.StatusCode, body)
				}
				if e := g.log.waitFor(t, "http", "llm.test"); e.Allowed || e.Status != 403 || !slices.Equal(e.Sentinels, []string{"LLM_TOKEN"}) {
					t.Errorf("entry %+v, want refused, the sentinel left", e)
				}
				select {
				case v := <-got:
					t.Errorf("the upstream got a request: %q", v)
				default:
				}
				return
			}
			for i := range 2 {
				resp, body := do(t, client, "GET", "http://"+host+"/plain", http.Header{"X-Key": {s}, "Accept-Encoding": {"gzip"}})
				if resp.StatusCode != 200 || body != "X-Key was "+maskFor("LLM_TOKEN") || resp.ContentLength != -1 || resp.Header.Get("Content-Encoding") != "" {
					t.Errorf("request %d: %d %q (length %d, %v), want the echo decoded and masked", i, resp.StatusCode, body, resp.ContentLength, resp.Header)
				}
				if v := <-got; v != realValue+" identity" {
					t.Errorf("request %d: the upstream got %q, want the value, and identity asked", i, v)
				}
			}
		})
	}
}
