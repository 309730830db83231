package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// options are the flags of the network clients; each command uses the ones
// that make sense for it.
type options struct {
	timeout time.Duration
	cacert  string
	noProxy bool
	socks   bool
	failErr bool   // fetch: exit 1 after printing a non-2xx answer, as curl --fail-with-body
	bearer  string // a variable whose value every request carries as its bearer token
}

// parse reads cmd's flags, wherever they are among the arguments ("--"
// ends them), and requires n arguments. web adds the flags of the HTTP
// clients.
func parse(cmd string, args []string, n int, timeout time.Duration, web bool) (options, []string) {
	var o options
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.DurationVar(&o.timeout, "timeout", timeout, "how long to wait")
	if web {
		fs.StringVar(&o.cacert, "cacert", "", "trust only the CA in this PEM file")
		fs.BoolVar(&o.noProxy, "no-proxy", false, "ignore the proxy variables")
		fs.BoolVar(&o.socks, "socks", false, "use the SOCKS5 proxy in ALL_PROXY")
		fs.BoolVar(&o.failErr, "fail", false, "exit 1 after printing an answer that is not 2xx")
		fs.StringVar(&o.bearer, "bearer-env", "", "send the value of this variable as the bearer token")
	}
	var pos []string
	for rest := args; len(rest) > 0; {
		if err := fs.Parse(rest); err != nil {
			fail(fmt.Errorf("%s: %w", cmd, err))
		}
		left := fs.Args()
		if used := len(rest) - len(left); used > 0 && rest[used-1] == "--" {
			pos = append(pos, left...)
			break
		}
		if len(left) == 0 {
			break
		}
		pos = append(pos, left[0])
		rest = left[1:]
	}
	need(pos, n)
	return o, pos
}

// tcpEcho talks to the echo server of "probe serve": greeting, one line, its echo.
func tcpEcho(args []string) {
	o, args := parse("tcp", args, 2, 5*time.Second, false)
	conn, err := net.DialTimeout("tcp", args[0], o.timeout)
	check(err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(o.timeout))
	r := bufio.NewReader(conn)
	greeting, err := r.ReadString('\n')
	check(wrap("reading the greeting", err))
	fmt.Printf("greeting: %s\n", strings.TrimSuffix(greeting, "\n"))
	_, err = io.WriteString(conn, args[1]+"\n")
	check(err)
	echo, err := r.ReadString('\n')
	check(wrap("reading the echo", err))
	fmt.Printf("echo: %s\n", strings.TrimSuffix(echo, "\n"))
}

// udpSend sends one datagram and prints the one reply.
func udpSend(args []string) {
	o, args := parse("udp", args, 2, 2*time.Second, false)
	conn, err := net.DialTimeout("udp", args[0], o.timeout)
	check(err)
	defer conn.Close()
	_, err = conn.Write([]byte(args[1]))
	check(err)
	conn.SetReadDeadline(time.Now().Add(o.timeout))
	buf := make([]byte, 64<<10)
	n, err := conn.Read(buf)
	check(wrap("waiting for a reply from "+args[0], err))
	fmt.Printf("reply: %s\n", buf[:n])
}

// dnsQuery sends one raw DNS query and prints the rcode and the addresses
// in the answer, so a test sees exactly what a DNS server says.
func dnsQuery(args []string) {
	o, args := parse("dns", args, 2, 2*time.Second, false)
	server, name := args[0], args[1]
	qtype := dnsmessage.TypeA
	if len(args) > 2 {
		switch strings.ToUpper(args[2]) {
		case "A":
		case "AAAA":
			qtype = dnsmessage.TypeAAAA
		default:
			fail(fmt.Errorf("dns: type %q is neither A nor AAAA", args[2]))
		}
	}
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	qname, err := dnsmessage.NewName(name)
	check(err)
	var idb [2]byte
	rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	check(b.StartQuestions())
	check(b.Question(dnsmessage.Question{Name: qname, Type: qtype, Class: dnsmessage.ClassINET}))
	query, err := b.Finish()
	check(err)

	conn, err := net.DialTimeout("udp", server, o.timeout)
	check(err)
	defer conn.Close()
	_, err = conn.Write(query)
	check(err)
	conn.SetReadDeadline(time.Now().Add(o.timeout))
	buf := make([]byte, 64<<10)
	n, err := conn.Read(buf)
	check(wrap("waiting for a DNS reply from "+server, err))

	var p dnsmessage.Parser
	h, err := p.Start(buf[:n])
	if err != nil {
		fail(fmt.Errorf("the reply from %s is not a DNS message: %v (%q)", server, err, buf[:n]))
	}
	if !h.Response || h.ID != id {
		fail(fmt.Errorf("the reply from %s does not answer the query (response=%v id=%d, want %d)", server, h.Response, h.ID, id))
	}
	check(p.SkipAllQuestions())
	fmt.Printf("rcode %s\n", rcodeName(h.RCode))
	for {
		ah, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			fail(fmt.Errorf("parsing the answers from %s: %w", server, err))
		}
		switch ah.Type {
		case dnsmessage.TypeA:
			r, err := p.AResource()
			check(err)
			fmt.Println(net.IP(r.A[:]))
		case dnsmessage.TypeAAAA:
			r, err := p.AAAAResource()
			check(err)
			fmt.Println(net.IP(r.AAAA[:]))
		default:
			check(p.SkipAnswer())
		}
	}
}

// rcodeName spells an rcode as dig does.
func rcodeName(c dnsmessage.RCode) string {
	switch c {
	case dnsmessage.RCodeSuccess:
		return "NOERROR"
	case dnsmessage.RCodeFormatError:
		return "FORMERR"
	case dnsmessage.RCodeServerFailure:
		return "SERVFAIL"
	case dnsmessage.RCodeNameError:
		return "NXDOMAIN"
	case dnsmessage.RCodeNotImplemented:
		return "NOTIMP"
	case dnsmessage.RCodeRefused:
		return "REFUSED"
	}
	return strconv.Itoa(int(c))
}

// resolve looks a name up as any program would: the pure Go resolver,
// configured by /etc/resolv.conf and /etc/hosts.
func resolve(args []string) {
	o, args := parse("resolve", args, 1, 5*time.Second, false)
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, args[0])
	check(err)
	for _, a := range addrs {
		fmt.Println(a)
	}
}

// client builds the HTTP client the options ask for; it opens a new
// connection for every request.
func client(o options) *http.Client {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: o.timeout}).DialContext,
		TLSHandshakeTimeout:   o.timeout,
		ResponseHeaderTimeout: o.timeout,
		DisableKeepAlives:     true, // every request on a new connection
	}
	switch {
	case o.noProxy:
		tr.Proxy = nil
	case o.socks:
		raw := os.Getenv("ALL_PROXY")
		if raw == "" {
			raw = os.Getenv("all_proxy")
		}
		if raw == "" {
			fail(errors.New("--socks: ALL_PROXY is not set"))
		}
		u, err := url.Parse(raw)
		check(wrap("--socks: ALL_PROXY", err))
		if u.Scheme != "socks5" && u.Scheme != "socks5h" {
			fail(fmt.Errorf("--socks: ALL_PROXY %q is not a socks5:// or socks5h:// URL", raw))
		}
		tr.Proxy = http.ProxyURL(u)
	}
	if o.cacert != "" {
		pem, err := os.ReadFile(o.cacert)
		check(err)
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fail(fmt.Errorf("--cacert: no certificate in %s", o.cacert))
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	if o.bearer != "" {
		return &http.Client{Transport: bearer{tr, "Bearer " + os.Getenv(o.bearer)}}
	}
	return &http.Client{Transport: tr}
}

// bearer sends every request with an Authorization header.
type bearer struct {
	rt   http.RoundTripper
	auth string
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", b.auth)
	return b.rt.RoundTrip(r)
}

// fetch prints the status and the start of the body of one GET.
func fetch(args []string) {
	o, args := parse("fetch", args, 1, 5*time.Second, true)
	c := client(o)
	c.Timeout = o.timeout
	resp, err := c.Get(args[0])
	check(err)
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	check(wrap("reading the body", err))
	fmt.Printf("status %d\n", resp.StatusCode)
	os.Stdout.Write(body)
	if len(body) > 0 && body[len(body)-1] != '\n' {
		fmt.Println()
	}
	if o.failErr && resp.StatusCode/100 != 2 {
		os.Exit(1)
	}
}

// download measures the throughput of one GET, or of N one after another
// (each on a new connection, as a new process would make it), a line each.
// The timeout bounds connecting, the headers and each wait for more of the
// body, not the whole transfer.
func download(args []string) {
	o, args := parse("download", args, 1, 5*time.Second, true)
	n := 1
	if len(args) > 1 {
		var err error
		if n, err = strconv.Atoi(args[1]); err != nil || n < 1 {
			fail(fmt.Errorf("download: N %q is not a positive number", args[1]))
		}
	}
	c := client(o)
	buf := make([]byte, 256<<10)
	for range n {
		total, sec := downloadOnce(c, o, args[0], buf)
		fmt.Printf("bytes %d seconds %.6f\n", total, sec)
	}
}

func downloadOnce(c *http.Client, o options, url string, buf []byte) (int64, float64) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	check(err)
	stall := fmt.Errorf("nothing received for %v", o.timeout)
	timer := time.AfterFunc(o.timeout, func() { cancel(stall) })
	defer timer.Stop()
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil && context.Cause(ctx) != nil {
		err = fmt.Errorf("GET %s: %w", url, context.Cause(ctx))
	}
	check(err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fail(fmt.Errorf("GET %s: %s", url, resp.Status))
	}
	timer.Reset(o.timeout)
	var total int64
	for {
		n, err := resp.Body.Read(buf)
		total += int64(n)
		timer.Reset(o.timeout)
		if err == io.EOF {
			break
		}
		if err != nil {
			if cause := context.Cause(ctx); cause != nil {
				err = cause
			}
			fail(fmt.Errorf("reading the body after %d bytes: %w", total, err))
		}
	}
	return total, time.Since(start).Seconds()
}

// latency times n GETs, each on a connection of its own, and prints the
// median and the 99th percentile (nearest rank).
func latency(args []string) {
	o, args := parse("latency", args, 2, 5*time.Second, true)
	n, err := strconv.Atoi(args[0])
	check(err)
	if n < 1 {
		fail(fmt.Errorf("latency: N must be at least 1, not %d", n))
	}
	c := client(o)
	c.Timeout = o.timeout
	ds := make([]time.Duration, n)
	for i := range ds {
		start := time.Now()
		resp, err := c.Get(args[1])
		if err != nil {
			fail(fmt.Errorf("request %d: %w", i+1, err))
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			fail(fmt.Errorf("request %d: reading the body: %w", i+1, err))
		}
		if resp.StatusCode/100 != 2 {
			fail(fmt.Errorf("request %d: GET %s: %s", i+1, args[1], resp.Status))
		}
		ds[i] = time.Since(start)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	rank := func(p int) time.Duration { return ds[(p*n+99)/100-1] }
	fmt.Printf("p50_us %d p99_us %d n %d\n", rank(50).Microseconds(), rank(99).Microseconds(), n)
}

// wrap says what was being done when err happened; nil stays nil.
func wrap(doing string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// unixGet sends GET path over HTTP on the unix socket sock and prints
// "status N" then the first 4 KiB of the body.
func unixGet(sock, path string) {
	c := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}},
	}
	resp, err := c.Get("http://engine" + path)
	check(err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Printf("status %d\n%s\n", resp.StatusCode, body)
}
