package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
)

// ServeHTTPProxy serves the HTTP proxy on l: CONNECT host:port for anything
// over TLS (or any TCP protocol a rule allows), and absolute-URI requests
// (GET http://host/path) for plain HTTP. Every request is decided by the
// policy; a denied one gets 403 Forbidden, its body the DenialHint.
// ServeHTTPProxy returns nil once l is closed, after closing the connections
// it accepted.
func (c *Config) ServeHTTPProxy(l net.Listener) error {
	return c.serve(l, "http", handshakeTimeout, c.serveHTTPConn)
}

// maxHeaderBytes bounds a request line and its headers, as net/http's
// DefaultMaxHeaderBytes does.
const maxHeaderBytes = http.DefaultMaxHeaderBytes

// serveHTTPConn reads requests from one client connection until it closes,
// a CONNECT takes the connection over, or a request is refused.
func (c *Config) serveHTTPConn(ctx context.Context, conn net.Conn, timeout time.Duration) {
	lr := &io.LimitedReader{R: conn}
	br := bufio.NewReader(lr)
	for {
		conn.SetDeadline(time.Now().Add(timeout))
		lr.N = maxHeaderBytes
		req, err := http.ReadRequest(br)
		lr.N = math.MaxInt64 // the body and the tunnel are not limited
		if err != nil {
			var ne net.Error
			if errors.Is(err, io.EOF) || errors.As(err, &ne) && ne.Timeout() || errors.Is(err, net.ErrClosed) {
				return // an idle client went away or stayed silent
			}
			c.badRequest(conn, "", "not an HTTP request", err)
			return
		}
		if req.Method == http.MethodConnect {
			c.connect(ctx, conn, br, req, timeout)
			return
		}
		if !c.forward(ctx, conn, req, timeout) {
			return
		}
	}
}

// badRequest answers 400 and logs why.
func (c *Config) badRequest(conn net.Conn, host, reason string, err error) {
	e := decisionlog.Entry{Time: c.now().UTC(), Client: conn.RemoteAddr().String(), Via: "http", Host: host, Reason: reason}
	if err != nil {
		e.Error = err.Error()
	}
	c.record(e)
	refuse(conn, http.StatusBadRequest, "propio-sandbox gateway: "+reason+"\n")
}

// connect serves CONNECT host:port: decide, connect upstream, answer 200,
// relay, and log once with the bytes each way.
func (c *Config) connect(ctx context.Context, conn net.Conn, br *bufio.Reader, req *http.Request, timeout time.Duration) {
	host, port, err := splitHostPort(req.URL.Host)
	if err != nil {
		c.badRequest(conn, req.URL.Host, "CONNECT wants host:port", err)
		return
	}
	e := c.decideAsk(ctx, conn.RemoteAddr(), "connect", host, port)
	conn.SetDeadline(time.Now().Add(timeout)) // it may have waited for an answer
	if e.Allowed && c.intercepts(host, port) {
		// Opened by the gateway: each request goes upstream on its own.
		if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			e.Error = err.Error()
			c.record(e)
			return
		}
		conn.SetDeadline(time.Time{})
		c.interceptPeeked(ctx, &bufferedConn{Conn: conn, r: br}, &target{host: host, port: port, via: "connect", decided: e}, e)
		return
	}
	up, status, body := c.open(ctx, &e, timeout)
	if up == nil {
		c.record(e)
		refuse(conn, status, body)
		return
	}
	defer up.Close()
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		e.Error = err.Error()
		c.record(e)
		return
	}
	conn.SetDeadline(time.Time{})
	client := conn
	if br.Buffered() > 0 { // the client did not wait for the 200
		client = &bufferedConn{Conn: conn, r: br}
	}
	e.BytesUp, e.BytesDown = c.relay(ctx, client, up)
	c.record(e)
}

// open connects to the destination of an entry made by decide. On refusal or
// failure it returns no connection, updates e, and gives the status and body
// to answer with: 403 and the denial hint for a denied destination, 403 for an
// allowed name that resolves to an address that is always denied, 502 when
// the destination cannot be reached.
func (c *Config) open(ctx context.Context, e *decisionlog.Entry, timeout time.Duration) (net.Conn, int, string) {
	if !e.Allowed {
		return nil, http.StatusForbidden, c.DenialHint(e.Host, e.Port)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	up, err := c.upstream(ctx, e.Host, e.Port)
	var refused *refusedError
	switch {
	case errors.As(err, &refused):
		e.Allowed, e.Reason, e.Rule = false, e.Reason+", but "+refused.Error(), ""
		return nil, http.StatusForbidden, "propio-sandbox gateway: " + refused.Error() + "; the gateway never connects there.\n"
	case err != nil:
		e.Error = err.Error()
		return nil, http.StatusBadGateway, "propio-sandbox gateway: " + err.Error() + "\n"
	}
	return up, 0, ""
}

// forward serves one absolute-URI request: decide on the URL's host and port,
// send the request upstream on a connection of its own, and stream the
// response back. It logs one entry whose bytes are those written upstream
// (request line, headers, body) and to the client (the whole response). It
// reports whether the client connection may carry another request.
func (c *Config) forward(ctx context.Context, conn net.Conn, req *http.Request, timeout time.Duration) bool {
	if req.URL.Scheme != "http" || req.URL.Host == "" {
		reason := "not a proxy request: send an absolute URI (GET http://host/path) or CONNECT host:port"
		if req.URL.Scheme == "https" {
			reason = "https:// is not proxied as a plain request: use CONNECT host:443"
		}
		c.badRequest(conn, req.URL.Host, reason, nil)
		return false
	}
	host, port := req.URL.Hostname(), uint16(80)
	if p := req.URL.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			c.badRequest(conn, req.URL.Host, "port "+strconv.Quote(p)+" is not a number from 1 to 65535", nil)
			return false
		}
		port = uint16(n)
	}
	e := c.decideAsk(ctx, conn.RemoteAddr(), "http", host, port)
	conn.SetDeadline(time.Now().Add(timeout)) // it may have waited for an answer
	run := c.run.Load()
	var masking *matcher
	if e.Allowed && c.intercepts(host, port) {
		// A request the gateway sees whole: judged by its method and path,
		// and brokered.
		e.Method, e.Path = req.Method, req.URL.Path
		if d := c.Policy.DecideRequest(host, port, req.Method, req.URL.Path, req.URL.EscapedPath()); !d.Allowed && d.Request {
			e.Allowed, e.Rule, e.Reason, e.Status = false, d.Rule, d.Reason, http.StatusForbidden
			c.record(e)
			refuse(conn, http.StatusForbidden, c.RequestDenialHint(host, port, req.Method, req.URL.Path, d))
			return false
		}
		masking = run.matcher(host, port)
	}
	b := run.brokerHeaders(host, port, false, req.Header)
	e.Secrets, e.Sentinels = b.put, b.left
	for _, name := range run.sentinelsIn(req.URL.RawQuery + req.URL.EscapedPath()) {
		e.Sentinels = appendOnce(e.Sentinels, name)
	}
	if len(b.cleartext) > 0 {
		// A value goes over TLS alone, unless the profile says otherwise
		// for this host: the request is not sent.
		t := &target{host: host, port: port}
		e.Method, e.Path, e.Secrets, e.Sentinels = req.Method, req.URL.Path, nil, append(e.Sentinels, b.cleartext...)
		e.Allowed, e.Rule, e.Status = false, "", http.StatusForbidden
		e.Reason = cleartextReason(b.cleartext, host, port)
		c.record(e)
		refuse(conn, http.StatusForbidden, c.cleartextHint(t, req, b.cleartext))
		return false
	}
	if masking != nil {
		askWhole(req.Header)
	}
	if len(e.Secrets)+len(e.Sentinels) > 0 {
		e.Method, e.Path = req.Method, req.URL.Path // a request the log names whole
	}
	up, status, body := c.open(ctx, &e, timeout)
	if up == nil {
		c.record(e)
		refuse(conn, status, body)
		return false
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { up.Close() }) // shutdown ends a stalled upstream
	defer stop()
	conn.SetDeadline(time.Time{})

	clientKeepAlive := !req.Close // before exchange closes the upstream side
	sent, down := &countWriter{w: c.limit(ctx, up, dirUp)}, &countWriter{w: c.limit(ctx, conn, dirDown)}
	resp, err := exchange(req, up, sent, down)
	if err != nil {
		e.BytesUp, e.BytesDown, e.Error = sent.n, down.n, err.Error()
		c.record(e)
		refuse(conn, http.StatusBadGateway, "propio-sandbox gateway: "+err.Error()+"\n")
		return false
	}
	defer resp.Body.Close()
	if masking != nil {
		if err := maskResponse(resp, masking, &e.Masked); err != nil {
			e.BytesUp, e.BytesDown, e.Error = sent.n, down.n, err.Error()
			c.record(e)
			refuse(conn, http.StatusBadGateway, "propio-sandbox gateway: "+err.Error()+"\n")
			return false
		}
		if resp.ContentLength < 0 && resp.Body != http.NoBody {
			resp.TransferEncoding = []string{"chunked"}
		}
	}
	if e.Method != "" {
		e.Status = resp.StatusCode
	}
	keepAlive, err := respond(resp, clientKeepAlive, down)
	e.BytesUp, e.BytesDown = sent.n, down.n
	if err != nil {
		e.Error = err.Error()
	}
	c.record(e)
	return keepAlive && err == nil
}

// exchange sends req to up (through sent, which counts) and reads the final
// response. A client that expects 100 Continue gets it from the proxy, on
// down.
func exchange(req *http.Request, up net.Conn, sent, down io.Writer) (*http.Response, error) {
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		req.Header.Del("Expect")
		if _, err := io.WriteString(down, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return nil, err
		}
	}
	removeHopHeaders(req.Header)
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // send none rather than Go's
	}
	req.Close = true // one upstream connection per request
	if err := req.Write(sent); err != nil {
		return nil, fmt.Errorf("sending the request upstream: %w", err)
	}
	ubr := bufio.NewReader(up)
	for {
		resp, err := http.ReadResponse(ubr, req)
		switch {
		case err != nil:
			return nil, fmt.Errorf("reading the upstream response: %w", err)
		case resp.StatusCode == http.StatusSwitchingProtocols:
			resp.Body.Close()
			return nil, errors.New("the upstream switched protocols, which the plain HTTP proxy does not relay: use CONNECT")
		case resp.StatusCode >= 200:
			return resp, nil
		}
		resp.Body.Close() // another 1xx: nothing the client needs
	}
}

// respond writes resp to down, streaming its body. It reports whether the
// client connection may carry another request: not if the client asked to
// close (keepAlive false), nor if the body can only end by closing it.
func respond(resp *http.Response, keepAlive bool, down io.Writer) (bool, error) {
	removeHopHeaders(resp.Header)
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	if resp.ContentLength < 0 && !isChunked(resp.TransferEncoding) {
		keepAlive = false // as Response.Write decides
	}
	resp.Close = !keepAlive
	w := &batchWriter{w: down}
	resp.Body = flushBeforeRead{ReadCloser: resp.Body, w: w}
	err := resp.Write(w)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		return false, fmt.Errorf("relaying the response: %w", err)
	}
	return keepAlive, nil
}

func isChunked(te []string) bool { return len(te) > 0 && te[0] == "chunked" }

// hopHeaders concern one connection, not the request (RFC 9110, section 7.6.1).
var hopHeaders = []string{"Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// removeHopHeaders deletes the hop-by-hop headers, those named by Connection,
// and every Proxy-* header (credentials for this proxy go no further).
func removeHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
	for name := range h {
		if strings.HasPrefix(textproto.CanonicalMIMEHeaderKey(name), "Proxy-") {
			delete(h, name)
		}
	}
}

// splitHostPort splits a CONNECT target; the port is required.
func splitHostPort(hostport string) (string, uint16, error) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, err
	}
	if host == "" {
		return "", 0, fmt.Errorf("%q has no host", hostport)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("port %q is not a number from 1 to 65535", p)
	}
	return host, uint16(n), nil
}

// refuse answers a request the gateway will not carry, then ends the
// connection gently: closing a socket with unread input (the body of a
// denied POST) resets it, and the client would see the reset, not the answer.
func refuse(conn net.Conn, code int, body string) {
	conn.SetDeadline(time.Now().Add(lingerTimeout))
	_, err := fmt.Fprintf(conn, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
	if err != nil {
		return
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		io.Copy(io.Discard, io.LimitReader(conn, lingerBytes))
	}
}

// A refused client has lingerTimeout to stop sending; lingerBytes more are
// read and dropped at most.
const (
	lingerTimeout = time.Second
	lingerBytes   = 1 << 20
)

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (w *countWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.n += int64(n)
	return n, err
}

// batchWriter gathers small writes (a response's header lines, chunk framing)
// until Flush, so a response does not leave as one packet per line.
type batchWriter struct {
	w   io.Writer
	buf []byte
}

const batchSize = 32 << 10

func (b *batchWriter) Write(p []byte) (int, error) {
	if len(b.buf)+len(p) > batchSize {
		if err := b.Flush(); err != nil {
			return 0, err
		}
		if len(p) > batchSize {
			return b.w.Write(p)
		}
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Flush writes what was gathered.
func (b *batchWriter) Flush() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.w.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// flushBeforeRead flushes w before each read of a response body, so whatever
// arrived so far reaches the client before the proxy waits for more (a
// streamed completion arrives as it is generated).
type flushBeforeRead struct {
	io.ReadCloser
	w *batchWriter
}

func (r flushBeforeRead) Read(p []byte) (int, error) {
	if err := r.w.Flush(); err != nil {
		return 0, err
	}
	return r.ReadCloser.Read(p)
}
