package portrelay

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// echoServer greets each connection with "hello" and echoes its lines.
func echoServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintln(c, "hello")
				s := bufio.NewScanner(c)
				for s.Scan() {
					fmt.Fprintln(c, "echo "+s.Text())
				}
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestRelay carries a connection from a host listener through the relay's
// unix socket to a TCP server, both ways, and stops both ends with their
// contexts.
func TestRelay(t *testing.T) {
	port := echoServer(t)
	dir, err := os.MkdirTemp("", "relay")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, SocketName(port))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- Serve(relayCtx, sock, port) }()

	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fwdCtx, stopFwd := context.WithCancel(ctx)
	fwdDone := make(chan error, 1)
	go func() {
		fwdDone <- Forward(fwdCtx, host, func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			for {
				c, err := d.DialContext(ctx, "unix", sock)
				if err == nil || ctx.Err() != nil {
					return c, err
				}
				select { // the relay's socket appears when Serve listens
				case <-ctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			}
		})
	}()

	c, err := net.Dial("tcp", host.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	fmt.Fprintln(c, "one")
	for _, want := range []string{"hello", "echo one"} {
		line, err := r.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != want {
			t.Fatalf("read %q, %v; want %q", line, err, want)
		}
	}

	stopFwd()
	if err := <-fwdDone; err != nil {
		t.Errorf("Forward: %v", err)
	}
	if _, err := r.ReadString('\n'); err == nil {
		t.Errorf("the connection still carries after Forward ended")
	}
	if _, err := net.Dial("tcp", host.Addr().String()); err == nil {
		t.Errorf("the host listener still accepts after Forward ended")
	}
	stopRelay()
	if err := <-relayDone; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("the relay's socket remains after Serve ended: %v", err)
	}
}

func TestServeBadPort(t *testing.T) {
	for _, port := range []int{0, -1, 65536} {
		if err := Serve(context.Background(), filepath.Join(t.TempDir(), "x.sock"), port); err == nil {
			t.Errorf("Serve port %d: no error", port)
		}
	}
}
