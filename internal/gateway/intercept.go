package gateway

// The connections the gateway opens: to a host a secret may go to, or one
// whose requests the rules limit. Over TLS (port 443 by its server name, a
// CONNECT or SOCKS5 tunnel, a forwarded port that carries TLS) the gateway
// terminates TLS with a certificate for the host signed by the run's CA, and
// serves HTTP/1.1 or HTTP/2, as the client asks, to a reverse proxy that
// judges each request by its method and path, puts the real values of the
// secrets that may go there in place of their sentinels, and sends it on
// over TLS of its own, to the host the connection was decided for, whose
// certificate it verifies against the system's roots and the profile's
// upstream_ca; never skipped. Plain HTTP is served the same, without TLS,
// but a secret's value goes into none of its requests unless the secret's
// cleartext hosts name the host: a request with its sentinel gets a 403.
// Each request is logged, with what was put in, left or masked; so is the
// connection, with its bytes, once it ends.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
)

// target is a connection the gateway opens: the host and port it was
// decided for, how it came, and the run it belongs to.
type target struct {
	host    string
	port    uint16
	tls     bool
	via     string
	client  string
	run     *run
	decided decisionlog.Entry // the connection's decision
}

// interceptor serves the requests of the connections the gateway opens:
// one HTTP server, fed each connection once its TLS is terminated, and a
// reverse proxy to the upstreams.
type interceptor struct {
	cfg     *Config
	srv     *http.Server
	ln      *connListener
	targets sync.Map // the connection the server gets -> *target
	h1, h2  *http.Transport
	proxy   *httputil.ReverseProxy
	served  chan struct{}
}

type targetKey struct{}

// interceptor is the gateway's, started on first use.
func (c *Config) interceptor() *interceptor {
	c.iceptOnce.Do(func() {
		ic := &interceptor{cfg: c, ln: newConnListener(), served: make(chan struct{})}
		ic.h1, ic.h2 = ic.transport(false), ic.transport(true)
		ic.proxy = &httputil.ReverseProxy{
			Rewrite:        ic.rewrite,
			Transport:      ic,
			ModifyResponse: ic.modifyResponse,
			ErrorHandler:   ic.proxyError,
			BufferPool:     bufferPool{},
			ErrorLog:       log.New(io.Discard, "", 0),
		}
		ic.srv = &http.Server{
			Handler:           ic,
			ReadHeaderTimeout: handshakeTimeout,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    maxHeaderBytes,
			ErrorLog:          log.New(io.Discard, "", 0),
			ConnContext: func(ctx context.Context, conn net.Conn) context.Context {
				t, _ := ic.targets.Load(conn)
				return context.WithValue(ctx, targetKey{}, t)
			},
			ConnState: func(conn net.Conn, s http.ConnState) {
				if s == http.StateClosed || s == http.StateHijacked {
					ic.targets.Delete(conn)
				}
			},
		}
		go func() {
			defer close(ic.served)
			_ = ic.srv.Serve(ic.ln)
		}()
		c.icept = ic
	})
	return c.icept
}

// stopIntercepting closes the interceptor, if it was started, and every
// connection it serves.
func (c *Config) stopIntercepting() {
	c.iceptOnce.Do(func() {}) // none starts after this
	if ic := c.icept; ic != nil {
		ic.srv.Close()
		<-ic.served
		ic.h1.CloseIdleConnections()
		ic.h2.CloseIdleConnections()
	}
}

// intercept serves the requests of an allowed connection to t.host:t.port,
// whose bytes the gateway must see: conn is the sandbox's side, its first
// bytes read already when peeked (replay). e is the connection's entry,
// logged once the connection has ended, with its bytes.
func (c *Config) intercept(ctx context.Context, conn net.Conn, t *target, e decisionlog.Entry) {
	t.run = c.run.Load()
	t.client = e.Client
	if t.tls && t.run == nil {
		e.Error = "the gateway has no CA for this run (its secrets were not handed over)"
		c.resetRefused(conn, e)
		return
	}
	cc := &countedConn{Conn: conn, w: c.limit(ctx, unwrap(conn), dirDown), closed: make(chan struct{})}
	var served net.Conn = cc
	if t.tls {
		raw := &recordBuffer{Conn: cc}
		tc := tls.Server(raw, &tls.Config{
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return t.run.issuer.Certificate(t.host) },
			NextProtos:     []string{"h2", "http/1.1"},
			MinVersion:     tls.VersionTLS12,
		})
		_ = tc.SetDeadline(time.Now().Add(peekTimeout))
		if err := tc.HandshakeContext(ctx); err != nil {
			e.Error = "TLS with the sandbox's client failed (does it trust the run's CA?): " + err.Error()
			e.BytesUp, e.BytesDown = cc.up.Load(), cc.down.Load()
			c.record(e)
			tc.Close()
			return
		}
		_ = tc.SetDeadline(time.Time{})
		served = tc
		if tc.ConnectionState().NegotiatedProtocol != "h2" {
			// HTTP/1.1: the server gets a connection whose writes leave
			// whole (HTTP/2's is the TLS connection itself, which the
			// server needs to know it).
			raw.buffer()
			served = &flushingConn{Conn: tc, raw: raw}
		}
	}
	ic := c.interceptor()
	ic.targets.Store(served, t)
	if !ic.ln.push(served) {
		ic.targets.Delete(served)
		served.Close()
	}
	select {
	case <-cc.closed:
	case <-ctx.Done():
		served.Close()
		<-cc.closed
	}
	e.BytesUp, e.BytesDown = cc.up.Load(), cc.down.Load()
	c.record(e)
}

// interceptPeeked serves a connection that may carry TLS or plain HTTP (a
// forwarded port): its first byte says which.
func (c *Config) interceptPeeked(ctx context.Context, conn net.Conn, t *target, e decisionlog.Entry) {
	_ = conn.SetReadDeadline(time.Now().Add(peekTimeout))
	var first [1]byte
	if _, err := io.ReadFull(conn, first[:]); err != nil {
		e.Error = "reading the first byte: " + err.Error()
		c.resetRefused(conn, e)
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	t.tls = first[0] == 0x16 // a TLS handshake record
	c.intercept(ctx, &bufferedConn{Conn: conn, r: io.MultiReader(strings.NewReader(string(first[:])), conn)}, t, e)
}

// ServeHTTP serves one request of an opened connection.
func (ic *interceptor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, _ := r.Context().Value(targetKey{}).(*target)
	if t == nil {
		http.Error(w, "propio-sandbox gateway: a connection of unknown destination\n", http.StatusInternalServerError)
		return
	}
	c := ic.cfg
	e := decisionlog.Entry{Time: c.now().UTC(), Client: t.client, Via: "http", Host: t.host, Port: t.port, Method: r.Method, Path: r.URL.Path}
	if t.tls {
		e.Via = "https"
	}
	if host, port, ok := requestHost(r.Host, t.port); !ok || !strings.EqualFold(strings.TrimSuffix(host, "."), t.host) || port != t.port {
		e.Reason, e.Status = fmt.Sprintf("the request is for %q on a connection to %s", r.Host, egress.Suggest(t.host, t.port)), http.StatusMisdirectedRequest
		c.record(e)
		http.Error(w, "propio-sandbox gateway: "+e.Reason+": the gateway sends a request only to the host its connection was allowed for\n", e.Status)
		return
	}
	// The connection was allowed (by a rule, or by the user): a request is
	// refused only by the methods and paths of the rules.
	e.Allowed, e.Rule, e.Reason, e.DecidedBy, e.Scope = true, t.decided.Rule, t.decided.Reason, t.decided.DecidedBy, t.decided.Scope
	d := c.Policy.DecideRequest(t.host, t.port, r.Method, r.URL.Path, r.URL.EscapedPath())
	if d.Allowed || d.Request {
		e.Allowed, e.Rule, e.Reason, e.DecidedBy, e.Scope = d.Allowed, d.Rule, d.Reason, "", ""
	}
	if !e.Allowed {
		e.Status = http.StatusForbidden
		c.record(e)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, c.RequestDenialHint(t.host, t.port, r.Method, r.URL.Path, d))
		return
	}
	x := &brokered{target: t, masking: t.run.matcher(t.host, t.port)}
	b := t.run.brokerHeaders(t.host, t.port, t.tls, r.Header)
	x.put, x.left = b.put, b.left
	for _, name := range t.run.sentinelsIn(r.URL.RawQuery + r.URL.EscapedPath()) {
		x.left = appendOnce(x.left, name)
	}
	if len(b.cleartext) > 0 {
		// A value goes over TLS alone, unless the profile says otherwise
		// for this host: the request is not sent, its sentinels stay here.
		e.Allowed, e.Rule, e.Status, e.Sentinels = false, "", http.StatusForbidden, append(x.left, b.cleartext...)
		e.Reason = cleartextReason(b.cleartext, t.host, t.port)
		c.record(e)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, c.cleartextHint(t, r, b.cleartext))
		return
	}
	body := &countingBody{r: r.Body}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = body
	}
	cw := &countingWriter{ResponseWriter: w}
	ic.proxy.ServeHTTP(cw, r.WithContext(context.WithValue(r.Context(), exchangeKey{}, x)))
	e.BytesUp, e.BytesDown, e.Status = body.n, cw.n, cw.status
	e.Secrets, e.Sentinels, e.Masked = x.put, x.left, x.masked
	if x.err != "" {
		e.Error = x.err
	}
	if x.refused != "" {
		e.Allowed, e.Rule, e.Reason = false, "", e.Reason+", but "+x.refused
	}
	c.record(e)
}

// brokered is what the proxy learns of one request, for its log entry.
type brokered struct {
	target *target
	// masking masks the values of the secrets that may go to the target
	// in what it answers; nil when none may.
	masking   *matcher
	put, left []string
	masked    []string
	err       string
	refused   string // an allowed name resolved to an address no rule can allow
}

type exchangeKey struct{}

func exchangeOf(r *http.Request) *brokered {
	x, _ := r.Context().Value(exchangeKey{}).(*brokered)
	return x
}

// rewrite sends the request to the host the connection was decided for, as
// the client addressed it (the Host header, checked to name that host).
func (ic *interceptor) rewrite(pr *httputil.ProxyRequest) {
	x := exchangeOf(pr.In)
	pr.Out.URL.Scheme = "http"
	if x.target.tls {
		pr.Out.URL.Scheme = "https"
	}
	pr.Out.URL.Host = net.JoinHostPort(strings.Trim(x.target.host, "[]"), strconv.Itoa(int(x.target.port)))
	pr.Out.Host = pr.In.Host
	if x.masking != nil {
		askWhole(pr.Out.Header)
	}
}

// RoundTrip sends a request on over HTTP/2 when the sandbox's client spoke
// it, else over HTTP/1.1, as the client would have.
// The headers of an informational (1xx) response, which the proxy passes
// on as it gets them, are masked first.
func (ic *interceptor) RoundTrip(r *http.Request) (*http.Response, error) {
	if x := exchangeOf(r); x != nil {
		if m := x.masking; m != nil {
			// The proxy's own hook runs after this one, on the same map.
			r = r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
				Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
					m.maskHeaders(http.Header(h), &x.masked)
					return nil
				},
			}))
		}
	}
	if r.ProtoMajor == 2 {
		return ic.h2.RoundTrip(r)
	}
	return ic.h1.RoundTrip(r)
}

// modifyResponse masks the real values of the secrets that may have gone
// to the host, in the response's headers and as its body streams
// (maskResponse).
func (ic *interceptor) modifyResponse(resp *http.Response) error {
	x := exchangeOf(resp.Request)
	if x.masking != nil {
		return maskResponse(resp, x.masking, &x.masked)
	}
	return nil
}

// gathered is the response's body read in whole buffers when it has a
// length and is no stream (a download: fewer, larger writes to the client;
// TLS reads a record at a time), as it is otherwise, so that a stream's
// events leave as they come.
func gathered(resp *http.Response) io.ReadCloser {
	ct := resp.Header.Get("Content-Type")
	if resp.ContentLength <= 0 || strings.HasPrefix(ct, "text/event-stream") {
		return resp.Body
	}
	return gather{resp.Body}
}

type gather struct{ io.ReadCloser }

func (g gather) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := g.ReadCloser.Read(p[n:])
		n += m
		if err != nil || m == 0 {
			return n, err
		}
	}
	return n, nil
}

// proxyError answers a request the upstream did not take: 403 for an
// address no rule can allow, 502 otherwise, saying why.
func (ic *interceptor) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeOf(r)
	var refused *refusedError
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var hostname x509.HostnameError
	status, msg := http.StatusBadGateway, err.Error()
	switch {
	case errors.As(err, &refused):
		status, msg = http.StatusForbidden, refused.Error()+"; the gateway never connects there"
		x.refused = refused.Error()
	case errors.As(err, &unknown), errors.As(err, &invalid), errors.As(err, &hostname):
		msg = "the upstream's certificate is not trusted: " + err.Error() + " (the gateway verifies it against the system's roots and network.upstream_ca)"
		x.err = msg
	case errors.Is(err, context.Canceled):
		x.err = "the sandbox's client went away"
	default:
		x.err = err.Error()
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	io.WriteString(w, "propio-sandbox gateway: "+msg+"\n")
}

// transport sends requests to the upstreams, each connection made through
// the gateway's own resolving and dialling (which refuses the addresses no
// rule can allow), TLS verified against UpstreamRoots (the system's when
// nil), HTTP/2 when h2 and the upstream agrees.
func (ic *interceptor) transport(h2 bool) *http.Transport {
	c := ic.cfg
	dial := func(ctx context.Context, addr string) (net.Conn, string, error) {
		host, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, "", err
		}
		port, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return nil, "", err
		}
		ctx, cancel := context.WithTimeout(ctx, upstreamTimeout)
		defer cancel()
		up, err := c.upstream(ctx, host, uint16(port))
		if err != nil {
			return nil, "", err
		}
		return &limitedConn{Conn: up, w: c.limit(context.Background(), up, dirUp)}, host, nil
	}
	protos := []string{"http/1.1"}
	if h2 {
		protos = []string{"h2", "http/1.1"}
	}
	return &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			conn, _, err := dial(ctx, addr)
			return conn, err
		},
		DialTLSContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			conn, host, err := dial(ctx, addr)
			if err != nil {
				return nil, err
			}
			// An address as the server name is verified against the
			// certificate's addresses (and sent as no SNI).
			tc := tls.Client(conn, &tls.Config{ServerName: host, RootCAs: c.UpstreamRoots, NextProtos: protos, MinVersion: tls.VersionTLS12})
			hctx, cancel := context.WithTimeout(ctx, upstreamTimeout)
			defer cancel()
			if err := tc.HandshakeContext(hctx); err != nil {
				conn.Close()
				return nil, err
			}
			return tc, nil
		},
		ForceAttemptHTTP2:     h2,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true, // the client's Accept-Encoding goes as it is
		ExpectContinueTimeout: time.Second,
	}
}

// requestHost splits a request's Host (or :authority) into its host and
// port, the connection's port when it names none; ok is false when it does
// not parse.
func requestHost(h string, connPort uint16) (string, uint16, bool) {
	if h == "" {
		return "", 0, false
	}
	host, p, err := net.SplitHostPort(h)
	if err != nil {
		return strings.Trim(h, "[]"), connPort, !strings.ContainsAny(h, "/@ ")
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, false
	}
	return host, uint16(port), true
}

// RequestDenialHint is what a client whose request the methods or paths of
// the rules refuse is told: what was refused, why, and where the rules are.
func (c *Config) RequestDenialHint(host string, port uint16, method, path string, d egress.Decision) string {
	target := egress.Suggest(host, port)
	head := "propio-sandbox gateway: " + method + " " + target + path + " is not allowed (" + d.Reason + ").\n"
	if !d.Request {
		return c.DenialHint(host, port)
	}
	where := c.Profile
	if where == "" {
		where = "the profile"
	}
	if strings.HasPrefix(where, "builtin:") {
		name, _, _ := strings.Cut(strings.TrimPrefix(where, "builtin:"), ":")
		return head + "To allow it, make a profile of your own that extends the built-in " + name + " (" + where + " cannot be edited):\n" +
			"    propio-sandbox init --extends " + name + "\n" +
			"then allow the request in the methods and paths of a network.allow rule for " + target + " there, and run `propio-sandbox trust`.\n"
	}
	return head + "To allow it, add the method or the path to the network.allow rule for " + target + " in " + where + " (or network.methods, for a rule that names no methods).\n"
}

// cleartextReason is why a plain HTTP request is refused: it carries the
// sentinels of secrets that go to host:port over TLS only.
func cleartextReason(names []string, host string, port uint16) string {
	return strings.Join(names, ", ") + " may go to " + egress.Suggest(host, port) + " over TLS only, and this request is plain HTTP"
}

// cleartextHint is what a client is told when a plain HTTP request carries
// the sentinels of secrets that go to its host over TLS only: nothing was
// sent; use https, or allow plain HTTP for the host in the profile.
func (c *Config) cleartextHint(t *target, r *http.Request, names []string) string {
	target := egress.Suggest(t.host, t.port)
	where := c.Profile
	if where == "" {
		where = "the profile"
	}
	return "propio-sandbox gateway: " + r.Method + " " + target + r.URL.Path + " is plain HTTP and carries the sentinel of " + strings.Join(names, ", ") +
		", whose value goes to " + target + " over TLS only: nothing was sent.\n" +
		"Use https://" + t.host + r.URL.Path + " instead; or, to send the value in clear (anyone on the way can read it), add the rule of secrets." + names[0] +
		".hosts that names " + target + " to secrets." + names[0] + ".cleartext_hosts, in a profile of your own (" + where + ").\n"
}

// countedConn is the sandbox's side of an opened connection: it counts the
// bytes each way, writes through the bandwidth cap, and says when it is
// closed.
type countedConn struct {
	net.Conn
	w        io.Writer // the connection, behind the cap
	up, down atomic.Int64
	once     sync.Once
	closed   chan struct{}
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.up.Add(int64(n))
	return n, err
}

func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.down.Add(int64(n))
	return n, err
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

// recordBuffer is the network side of the gateway's TLS with the sandbox:
// once buffering, it keeps what TLS writes (a record at a time) until
// flushed, so that the records of one write leave in one.
type recordBuffer struct {
	net.Conn
	mu  sync.Mutex
	on  bool
	buf []byte
}

func (b *recordBuffer) buffer() {
	b.mu.Lock()
	b.on = true
	b.mu.Unlock()
}

func (b *recordBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.on {
		return b.Conn.Write(p)
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *recordBuffer) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.Conn.Write(b.buf)
	if cap(b.buf) > 2*copyBufferSize {
		b.buf = nil // a burst's buffer is not kept
	} else {
		b.buf = b.buf[:0]
	}
	return err
}

// Close sends what is buffered (TLS's close_notify), then closes.
func (b *recordBuffer) Close() error {
	b.flush()
	return b.Conn.Close()
}

// flushingConn is the TLS connection with the sandbox as the HTTP/1.1
// server uses it: what a write (or a read: an alert, a key update) made TLS
// write leaves when it returns.
type flushingConn struct {
	*tls.Conn
	raw *recordBuffer
}

func (c *flushingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if ferr := c.raw.flush(); err == nil {
		err = ferr
	}
	return n, err
}

func (c *flushingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.raw.flush()
	return n, err
}

// limitedConn is an upstream connection: it writes through the bandwidth
// cap.
type limitedConn struct {
	net.Conn
	w io.Writer
}

func (c *limitedConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// countingBody counts a request body's bytes.
type countingBody struct {
	r io.ReadCloser
	n int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	return n, err
}

func (b *countingBody) Close() error { return b.r.Close() }

// countingWriter counts a response's body bytes and keeps its status; it
// flushes and hijacks through (http.ResponseController finds them).
type countingWriter struct {
	http.ResponseWriter
	n      int64
	status int
}

func (w *countingWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.n += int64(n)
	return n, err
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// bufferPool lends the proxy its copy buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, copyBufferSize); return &b }}

// copyBufferSize is what the proxy reads and writes at once: a download's
// body goes to the client in writes of this size, each one write to the
// network.
const copyBufferSize = 256 << 10

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }

// connListener hands the interceptor's server the connections pushed to it.
type connListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// push hands conn to the server; false once the listener is closed.
func (l *connListener) push(conn net.Conn) bool {
	select {
	case l.ch <- conn:
		return true
	case <-l.done:
		return false
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return &net.TCPAddr{} }
