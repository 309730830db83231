package gateway

// This file holds what every server shares: the accept loop (with shutdown,
// handshake deadlines and panic recovery), the upstream connection (resolve,
// refuse the addresses no rule can allow, dial) and relay, the byte pump
// (which the bandwidth cap slows).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
)

const (
	// handshakeTimeout bounds a connection's handshake: reading a request,
	// resolving and dialing upstream. A relay has no deadline.
	handshakeTimeout = 30 * time.Second
	// dialTimeout bounds one attempt at one upstream address.
	dialTimeout = 10 * time.Second
)

// handler serves one accepted connection. ctx ends when the server shuts
// down; timeout is the handshake deadline to apply.
type handler func(ctx context.Context, conn net.Conn, timeout time.Duration)

// serve accepts connections on l until l is closed, then closes every
// connection it accepted, waits for their handlers and returns nil. via names
// the server in the log entry of a recovered panic.
func (c *Config) serve(l net.Listener, via string, timeout time.Duration, handle handler) error {
	if c.Log == nil {
		return errors.New("gateway: Config.Log is required")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	defer func() {
		cancel()
		mu.Lock()
		for conn := range conns {
			conn.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	var backoff time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Running out of file descriptors passes; wait, as net/http does.
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("accepting %s connections: %w", via, err)
		}
		backoff = 0
		mu.Lock()
		conns[conn] = struct{}{}
		mu.Unlock()
		wg.Go(func() {
			defer func() {
				mu.Lock()
				delete(conns, conn)
				mu.Unlock()
				conn.Close()
			}()
			defer func() {
				if r := recover(); r != nil {
					c.record(decisionlog.Entry{
						Time: c.now().UTC(), Client: conn.RemoteAddr().String(), Via: via,
						Reason: "internal error", Error: fmt.Sprintf("panic: %v", r),
					})
				}
			}()
			handle(ctx, conn, timeout)
		})
	}
}

// record writes one log entry. A log that cannot be written cannot be told
// about it either, so the error is dropped.
func (c *Config) record(e decisionlog.Entry) {
	_ = c.Log.Write(e)
}

// refusedError is an allowed name that resolved to an address no rule can
// allow (DNS rebinding to a metadata service, for one).
type refusedError struct {
	host   string
	addr   netip.Addr
	reason string
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("%s resolves to %s: %s", e.host, e.addr, e.reason)
}

// ownReason is why the gateway never connects to an address it listens on:
// it would be talking to itself, in a loop.
const ownReason = "the gateway's own address is always denied"

// refuses says why an upstream may never be a, or returns "".
func (c *Config) refuses(a netip.Addr) string {
	a = a.Unmap()
	if why := egress.AlwaysDeniedReason(a); why != "" {
		return why
	}
	if c.Virtual.IsValid() && c.Virtual.Contains(a) {
		return ownReason
	}
	c.ownMu.Lock()
	defer c.ownMu.Unlock()
	if slices.Contains(c.own, a) {
		return ownReason
	}
	return ""
}

// addOwn records an address the gateway listens on.
func (c *Config) addOwn(a netip.Addr) {
	c.ownMu.Lock()
	defer c.ownMu.Unlock()
	if a = a.Unmap(); !slices.Contains(c.own, a) {
		c.own = append(c.own, a)
	}
}

// lookupError is a name that did not resolve.
type lookupError struct{ err error }

func (e *lookupError) Error() string { return e.err.Error() }
func (e *lookupError) Unwrap() error { return e.err }

// upstream connects to an allowed host:port: an address is dialed as it is, a
// name is resolved with c.resolve. If any address is always denied, or is one
// the gateway listens on, the connection is refused without dialing anything
// (*refusedError); otherwise the addresses are tried in order and the first
// that answers is returned.
func (c *Config) upstream(ctx context.Context, host string, port uint16) (net.Conn, error) {
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		addrs = []netip.Addr{a}
	} else {
		addrs, err = c.resolve(ctx, host)
		if err != nil {
			return nil, &lookupError{fmt.Errorf("resolving %s: %w", host, err)}
		}
		if len(addrs) == 0 {
			return nil, &lookupError{fmt.Errorf("resolving %s: no addresses", host)}
		}
	}
	for _, a := range addrs {
		if why := c.refuses(a); why != "" {
			return nil, &refusedError{host: host, addr: a.Unmap(), reason: why}
		}
	}
	var errs []error
	for _, a := range addrs { // the resolver's slice is its own: never written
		a = a.Unmap()
		dctx, cancel := context.WithTimeout(ctx, dialTimeout)
		conn, err := c.dial(dctx, "tcp", netip.AddrPortFrom(a, port).String())
		cancel()
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("connecting to %s: %w", net.JoinHostPort(host, fmt.Sprint(port)), errors.Join(errs...))
}

// relay copies a (the sandbox's side) to b (the upstream) and b to a until
// both directions have ended, and returns the bytes copied each way (up: a to
// b), each no faster than the gateway's bandwidth cap allows. A direction that
// reaches EOF half-closes its destination (CloseWrite where the connection has
// it), so the other direction can still finish; a direction that fails closes
// both connections, so the other one cannot hang. ctx ending stops a
// direction waiting for the cap.
func (c *Config) relay(ctx context.Context, a, b net.Conn) (up, down int64) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	// Written to as the plain connections they wrap, so that io.Copy from a
	// TCP connection to a TCP connection splices in the kernel.
	wg.Go(func() { down = pump(c.limit(ctx, unwrap(a), dirDown), a, b, cancel) })
	up = pump(c.limit(ctx, unwrap(b), dirUp), b, a, cancel)
	wg.Wait()
	return up, down
}

// pump copies src to dst, through w (dst, or dst behind the bandwidth cap),
// once, for relay. On failure it closes both connections and calls fail, which
// wakes the other direction if it waits for the cap.
func pump(w io.Writer, dst, src net.Conn, fail func()) int64 {
	n, err := io.Copy(w, src)
	if err != nil {
		dst.Close()
		src.Close()
		fail()
		return n
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); !ok || cw.CloseWrite() != nil {
		dst.Close()
	}
	return n
}

// unwrap returns the connection under a bufferedConn, whose buffering
// matters only for reading.
func unwrap(c net.Conn) net.Conn {
	for {
		b, ok := c.(*bufferedConn)
		if !ok {
			return c
		}
		c = b.Conn
	}
}

// bufferedConn is a connection whose first bytes were already read into r
// (a client that sent data right behind its CONNECT request).
type bufferedConn struct {
	net.Conn
	r io.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the underlying connection where it can.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
