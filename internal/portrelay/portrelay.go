// Package portrelay carries TCP connections from the host to a port of a
// running sandbox, in every network mode, with no port of the sandbox
// published by the engine: a relay container that shares the sandbox's
// network namespace (and has no network of its own) serves a unix socket in
// a directory of the user's and dials 127.0.0.1:PORT inside for each
// connection (Serve); the launcher listens on 127.0.0.1 and pipes each
// connection it accepts to that socket (Forward).
//
// It imports nothing of this module: the relay's subcommand and the launch
// both use it.
package portrelay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// SocketName is the name of the relay's socket for port in its directory.
func SocketName(port int) string { return strconv.Itoa(port) + ".sock" }

// Serve listens on the unix socket path and, for every connection, dials
// 127.0.0.1:port and pipes the two together, until ctx ends. The socket is
// removed when it returns.
func Serve(ctx context.Context, path string, port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("port %d is not between 1 and 65535", port)
	}
	os.Remove(path) // a relay's socket left by a relay that was killed
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", path, err)
	}
	defer os.Remove(path)
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return serve(ctx, ln, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", target)
	})
}

// Forward accepts connections on ln until ctx ends or ln is closed, and
// pipes each to a connection dial makes (the relay's socket). It closes ln
// and every connection it carries when ctx ends.
func Forward(ctx context.Context, ln net.Listener, dial func(context.Context) (net.Conn, error)) error {
	return serve(ctx, ln, dial)
}

// dialTimeout bounds the dial of one connection's other end.
const dialTimeout = 10 * time.Second

func serve(ctx context.Context, ln net.Listener, dial func(context.Context) (net.Conn, error)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipe(ctx, c, dial)
		}()
	}
}

// pipe carries c to a connection dial makes, both ways, until both sides
// have ended or ctx does; a connection dial cannot make closes c.
func pipe(ctx context.Context, c net.Conn, dial func(context.Context) (net.Conn, error)) {
	defer c.Close()
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	other, err := dial(dctx)
	cancel()
	if err != nil {
		return
	}
	defer other.Close()
	stop := context.AfterFunc(ctx, func() {
		c.Close()
		other.Close()
	})
	defer stop()
	done := make(chan struct{}, 2)
	go func() { copyHalf(other, c); done <- struct{}{} }()
	go func() { copyHalf(c, other); done <- struct{}{} }()
	<-done
	<-done
}

// copyHalf copies src to dst, then closes dst's writing half (or all of
// it), so that the other end sees the end of what src sent.
func copyHalf(dst, src net.Conn) {
	io.Copy(dst, src)
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	dst.Close()
}
