package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
)

const (
	// peekTimeout bounds how long a client may take to send its ClientHello
	// or request head.
	peekTimeout = 10 * time.Second
	// upstreamTimeout bounds resolving and dialling an upstream.
	upstreamTimeout = 10 * time.Second
	// refusalTimeout bounds writing a refusal and waiting for the client to
	// read it.
	refusalTimeout = 2 * time.Second
)

// ServeTLS routes the TLS connections accepted on l by the server name of
// their ClientHello, until l is closed; then it returns nil. port is the
// port the sandbox dialled (443 in production), which is also the upstream
// port. A connection without a server name, or to a name the policy denies
// on port, is reset. The handshake is not terminated: the bytes go to the
// upstream as the client sent them.
func (c *Config) ServeTLS(l net.Listener, port uint16) error {
	return c.acceptEach(l, "sni", func(ctx context.Context, conn net.Conn) {
		_ = conn.SetReadDeadline(time.Now().Add(peekTimeout))
		name, replay, err := peekSNI(conn)
		if err != nil {
			c.resetRefused(conn, decisionlog.Entry{Via: "sni", Port: port, Reason: "no server name", Error: err.Error()})
			return
		}
		_ = conn.SetReadDeadline(time.Time{})
		e := c.decideAsk(ctx, conn.RemoteAddr(), "sni", name, port)
		switch {
		case !e.Allowed:
			c.resetRefused(conn, e)
		case c.intercepts(name, port):
			c.intercept(ctx, &bufferedConn{Conn: conn, r: replay}, &target{host: name, port: port, tls: true, via: "sni", decided: e}, e)
		default:
			c.forwardAllowed(ctx, conn, replay, e)
		}
	})
}

// ServeHostHTTP routes the plain HTTP connections accepted on l by the Host
// header of their first request, until l is closed; then it returns nil.
// port is the port the sandbox dialled (80 in production), which is also the
// upstream port; a port in the Host header does not change it. A denied
// request gets a 403 whose body is the DenialHint.
func (c *Config) ServeHostHTTP(l net.Listener, port uint16) error {
	return c.acceptEach(l, "host", func(ctx context.Context, conn net.Conn) {
		_ = conn.SetReadDeadline(time.Now().Add(peekTimeout))
		host, _, replay, err := peekHost(conn)
		if err != nil {
			e := decisionlog.Entry{Time: c.now().UTC(), Client: conn.RemoteAddr().String(), Via: "host", Port: port, Reason: "no Host header", Error: err.Error()}
			_ = c.Log.Write(e)
			writeHTTPRefusal(conn, "400 Bad Request", "propio-sandbox gateway: cannot route this request: "+err.Error()+"\n")
			return
		}
		_ = conn.SetReadDeadline(time.Time{})
		e := c.decideAsk(ctx, conn.RemoteAddr(), "host", host, port)
		if !e.Allowed {
			_ = c.Log.Write(e)
			writeHTTPRefusal(conn, "403 Forbidden", c.DenialHint(host, port))
			return
		}
		if c.intercepts(host, port) {
			c.intercept(ctx, &bufferedConn{Conn: conn, r: replay}, &target{host: host, port: port, via: "host", decided: e}, e)
			return
		}
		up, err := c.dialChecked(ctx, &e)
		if up == nil {
			_ = c.Log.Write(e)
			if !e.Allowed {
				writeHTTPRefusal(conn, "403 Forbidden", "propio-sandbox gateway: "+egress.Suggest(host, port)+" is not allowed ("+e.Reason+").\n")
			} else {
				writeHTTPRefusal(conn, "502 Bad Gateway", "propio-sandbox gateway: cannot reach "+egress.Suggest(host, port)+": "+err.Error()+"\n")
			}
			return
		}
		c.pipeLogged(ctx, conn, replay, up, e)
	})
}

// ServeForward forwards every connection accepted on l to host:port, until l
// is closed; then it returns nil. It serves a host:port rule such as
// github.com:22: the sandbox resolves the name to the gateway and dials the
// port, on which the gateway listens. Each connection is decided again, so a
// forward left running after its rule is gone passes nothing.
func (c *Config) ServeForward(l net.Listener, host string, port uint16) error {
	return c.acceptEach(l, "tcp", func(ctx context.Context, conn net.Conn) {
		e := c.decide(conn.RemoteAddr(), "tcp", host, port)
		switch {
		case !e.Allowed:
			c.resetRefused(conn, e)
		case c.intercepts(host, port):
			c.interceptPeeked(ctx, conn, &target{host: host, port: port, via: "tcp", decided: e}, e)
		default:
			c.forwardAllowed(ctx, conn, conn, e)
		}
	})
}

// forwardAllowed connects an allowed client to its upstream (e.Host, e.Port),
// sends it replay (what the client sent, first what was peeked) and pipes
// both ways; it logs e with the byte counts. A client whose upstream cannot
// be reached, or may never be reached, is reset.
func (c *Config) forwardAllowed(ctx context.Context, conn net.Conn, replay io.Reader, e decisionlog.Entry) {
	up, _ := c.dialChecked(ctx, &e)
	if up == nil {
		c.resetRefused(conn, e)
		return
	}
	c.pipeLogged(ctx, conn, replay, up, e)
}

func (c *Config) pipeLogged(ctx context.Context, conn net.Conn, replay io.Reader, up net.Conn, e decisionlog.Entry) {
	defer up.Close()
	e.BytesUp, e.BytesDown = c.relay(ctx, &bufferedConn{Conn: conn, r: replay}, up)
	_ = c.Log.Write(e)
}

// dialChecked connects to the allowed e.Host:e.Port through upstream. When
// it returns no connection it has updated e: Allowed false with the reason
// for an address no rule can allow (DNS rebinding), or Error when the
// upstream could not be reached.
func (c *Config) dialChecked(ctx context.Context, e *decisionlog.Entry) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, upstreamTimeout)
	defer cancel()
	up, err := c.upstream(ctx, e.Host, e.Port)
	var refused *refusedError
	switch {
	case errors.As(err, &refused):
		e.Allowed, e.Rule, e.Reason = false, "", refused.Error()
	case err != nil:
		e.Error = err.Error()
	}
	return up, err
}

// resetRefused logs e and resets the connection.
func (c *Config) resetRefused(conn net.Conn, e decisionlog.Entry) {
	if e.Time.IsZero() {
		e.Time = c.now().UTC()
	}
	if e.Client == "" && conn.RemoteAddr() != nil {
		e.Client = conn.RemoteAddr().String()
	}
	_ = c.Log.Write(e)
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close with a RST, not a FIN: the client fails at once
	}
	_ = conn.Close()
}

// writeHTTPRefusal answers a plain HTTP client with status and a text body,
// then closes the connection once the client has read it (or refusalTimeout
// passed), so what it still sends does not turn the close into a reset that
// loses the answer.
func writeHTTPRefusal(conn net.Conn, status, body string) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(refusalTimeout))
	_, err := fmt.Fprintf(conn, "HTTP/1.1 %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", status, len(body), body)
	if err != nil {
		return
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		_, _ = io.Copy(io.Discard, io.LimitReader(conn, 256<<10))
	}
}

// acceptEach serves each connection on l with handle, through serve (which
// owns the accept loop, shutdown and panic recovery); the transparent
// servers set their own deadlines. ctx ends when the server shuts down.
func (c *Config) acceptEach(l net.Listener, via string, handle func(ctx context.Context, conn net.Conn)) error {
	return c.serve(l, via, handshakeTimeout, func(ctx context.Context, conn net.Conn, _ time.Duration) { handle(ctx, conn) })
}
