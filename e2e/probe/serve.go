package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv/zeros"
)

// The ports "probe serve" listens on.
const (
	httpPort  = 80
	httpsPort = 443
)

var (
	tcpPorts = []int{22, 7}
	udpPorts = []int{53, 9}
)

var sayMu sync.Mutex

// say prints one line of the server's log; stdout is unbuffered, so a test
// reading `docker logs` sees it at once.
func say(format string, args ...any) {
	sayMu.Lock()
	defer sayMu.Unlock()
	fmt.Printf(format+"\n", args...)
}

// serve is the stand-in for an internet server; it runs until killed.
func serve(name string) {
	offset := 0
	if s := os.Getenv("PROBE_PORT_OFFSET"); s != "" {
		n, err := strconv.Atoi(s)
		check(wrap("PROBE_PORT_OFFSET", err))
		offset = n
	}
	certDir := "/certs"
	if d := os.Getenv("PROBE_CERT_DIR"); d != "" {
		certDir = d
	}
	listen := func(port int) net.Listener {
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(port+offset))
		check(err)
		return loggingListener{ln, port}
	}

	h := handler(name)
	httpLn := listen(httpPort)
	go func() { fail(newServer(h).Serve(httpLn)) }()

	certFile, keyFile := filepath.Join(certDir, "server.pem"), filepath.Join(certDir, "server.key")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		say("no %s or %s: not serving HTTPS", certFile, keyFile)
	case err != nil:
		fail(fmt.Errorf("loading the server certificate: %w", err))
	default:
		srv := newServer(h)
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
		ln := listen(httpsPort)
		go func() { fail(srv.ServeTLS(ln, "", "")) }()
	}

	for _, port := range tcpPorts {
		ln := listen(port)
		go func() {
			for {
				conn, err := ln.Accept()
				check(err)
				go echo(conn, name, port)
			}
		}()
	}
	for _, port := range udpPorts {
		pc, err := net.ListenPacket("udp", ":"+strconv.Itoa(port+offset))
		check(err)
		go answerUDP(pc, name, port)
	}
	say("serving %s", name)
	select {}
}

func newServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
}

// handler answers GET /bytes/N with N zero bytes and anything else with
// "NAME http HOST PATH", HOST being the Host header; see serveCredentials
// for the paths that show credentials.
func handler(name string) http.Handler {
	release := make(chan struct{}, 1)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		say("http %s %s from %s", r.Host, r.URL.Path, r.RemoteAddr)
		if s, ok := strings.CutPrefix(r.URL.Path, "/bytes/"); ok {
			zeros.Serve(w, r, s)
			return
		}
		if serveCredentials(w, r, release) {
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "%s http %s %s\n", name, r.Host, r.URL.Path)
	})
}

// serveCredentials serves the paths of the brokering tests, and reports
// whether r was one of them:
//
//	/h/...      prints "headers PROTO METHOD PATH authorization=%q x-api-key=%q", answers as any path
//	/echo       answers "you sent " and the Authorization header it got (a careless server), gzipped when the client accepts gzip;
//	            /echo/gzip gzipped whatever the client accepts, /echo/br labelled br (not encoded: passed on, it shows),
//	            /echo/part?from=N&len=M only those characters of it, /echo/range with Range requests honoured
//	/git/...    asks for Basic credentials (401) until it gets some, then prints them as /h/ does and answers 404
//	/sse        server-sent events: "data: first", then, once /release is asked, "data: second"
//	/release    lets /sse go on
func serveCredentials(w http.ResponseWriter, r *http.Request, release chan struct{}) bool {
	headers := func() {
		say("headers %s %s %s authorization=%q x-api-key=%q", r.Proto, r.Method, r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"))
	}
	switch p := r.URL.Path; {
	case strings.HasPrefix(p, "/h/"):
		headers()
		return false
	case p == "/echo" || strings.HasPrefix(p, "/echo/"):
		headers()
		echoCredentials(w, r)
	case strings.HasPrefix(p, "/git/"):
		if r.Header.Get("Authorization") == "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "credentials, please", http.StatusUnauthorized)
			return true
		}
		headers()
		http.NotFound(w, r)
	case p == "/sse":
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return true
		case <-time.After(time.Minute):
		}
		fmt.Fprint(w, "data: second\n\n")
	case p == "/release":
		select {
		case release <- struct{}{}:
		default:
		}
		fmt.Fprintln(w, "released")
	default:
		return false
	}
	return true
}

// echoCredentials is /echo and its variants (serveCredentials). It prints
// "echo accept-encoding=%q range=%q" of what it was asked.
func echoCredentials(w http.ResponseWriter, r *http.Request) {
	say("echo accept-encoding=%q range=%q", r.Header.Get("Accept-Encoding"), r.Header.Get("Range"))
	auth := r.Header.Get("Authorization")
	if r.URL.Path == "/echo/part" {
		from, _ := strconv.Atoi(r.URL.Query().Get("from"))
		n, _ := strconv.Atoi(r.URL.Query().Get("len"))
		from, to := min(max(from, 0), len(auth)), min(max(from, 0)+max(n, 0), len(auth))
		auth = "..." + auth[from:to] + "..."
	}
	body := []byte("you sent " + auth + "\n")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	switch {
	case r.URL.Path == "/echo/range":
		http.ServeContent(w, r, "echo.txt", time.Time{}, bytes.NewReader(body))
		return
	case r.URL.Path == "/echo/br":
		w.Header().Set("Content-Encoding", "br")
	case r.URL.Path == "/echo/gzip" || strings.Contains(r.Header.Get("Accept-Encoding"), "gzip"):
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		gz.Write(body)
		gz.Close()
		body = buf.Bytes()
		w.Header().Set("Content-Encoding", "gzip")
	}
	w.Write(body)
}

// loggingListener prints "conn PORT from ADDR" for every connection it
// accepts; PORT is the nominal port, whatever the offset.
type loggingListener struct {
	net.Listener
	port int
}

func (l loggingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		say("conn %d from %s", l.port, c.RemoteAddr())
	}
	return c, err
}

// echo greets with "NAME tcp PORT" and sends every line back.
func echo(conn net.Conn, name string, port int) {
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "%s tcp %d\n", name, port); err != nil {
		return
	}
	s := bufio.NewScanner(conn)
	for s.Scan() {
		if _, err := conn.Write(append(s.Bytes(), '\n')); err != nil {
			return
		}
	}
}

// answerUDP prints every datagram and answers it with "NAME udp PORT".
func answerUDP(pc net.PacketConn, name string, port int) {
	reply := []byte(fmt.Sprintf("%s udp %d", name, port))
	buf := make([]byte, 64<<10)
	for {
		n, addr, err := pc.ReadFrom(buf)
		check(err)
		say("udp %d from %s: %q", port, addr, buf[:n])
		pc.WriteTo(reply, addr)
	}
}
