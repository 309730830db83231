// Command probe is the end-to-end tests' stand-in for an agent. It runs as
// the entrypoint of a FROM scratch image and does one thing per call, so a
// test can observe what the sandbox allows:
//
//	probe id                  print uid=U gid=G cwd=DIR home=HOME
//	probe env NAME...         print NAME=value, or NAME unset, for each
//	probe read PATH           print the file, or the error
//	probe write PATH TEXT     write TEXT to PATH (creating it), or print the error
//	probe ls PATH             list a directory, one name a line
//	probe fs OP...            file operations in order, each one argument ("write PATH TEXT", "mv A B", "fill PATH 100m", ...; see fs.go)
//	probe find TEXT DIR       read every file reachable below DIR, through links, and print "found PATH" for each holding TEXT, then "searched N files"
//	probe connect HOST:PORT   open a TCP connection and print what the peer sends first (each wait bounded by --timeout, 5s)
//	probe unixget SOCKET PATH GET PATH over HTTP on a unix socket (an engine's API), print "status N" then the first 4 KiB of the body
//	probe cat                 copy stdin to stdout
//	probe tty                 print whether stdin and stdout are terminals, and stdout's size when it is one
//	probe winch RxC           on a terminal: print "ready size=RxC", then "resized size=RxC" at each SIGWINCH, until the size is RxC (a minute at most)
//	probe stderr TEXT         print TEXT on stderr
//	probe sleep DURATION      sleep, printing "ready" first; on SIGTERM or SIGINT print it and exit 143 or 130
//	probe exit N              exit with status N
//	probe clock               print "clock NS", the wall clock in nanoseconds since the epoch, and exit 0
//	                          (when the sandbox's command ran, for the launch benchmark)
//
// Network clients (each wait bounded by --timeout, 5s unless said otherwise):
//
//	probe tcp HOST:PORT TEXT      read the greeting line, send TEXT, print "greeting: LINE" and "echo: LINE"
//	probe udp HOST:PORT TEXT      send one datagram, print "reply: TEXT" (waits 2s)
//	probe dns SERVER:PORT NAME [A|AAAA]
//	                              one raw query over UDP (waits 2s), print "rcode RCODE" then one address a line
//	probe resolve NAME            look NAME up with the system resolver (/etc/resolv.conf), one address a line
//	probe fetch URL               GET, print "status N" then the first 4 KiB of the body; --fail: then exit 1 unless 2xx
//	probe download URL [N]        GET (N times, default 1), discard the body, print "bytes N seconds S" a GET; --timeout bounds each wait, not the whole
//	probe latency N URL           N GETs, each on a new connection, print "p50_us X p99_us Y n N"
//
// fetch, download and latency take the proxy from HTTP_PROXY, HTTPS_PROXY and
// NO_PROXY unless given --no-proxy, or ALL_PROXY (socks5:// or socks5h://)
// with --socks; --cacert FILE trusts only the CA in FILE; --bearer-env VAR
// sends VAR's value as a bearer token. Flags may go
// anywhere among the arguments; "--" ends them.
//
// The stand-in for an internet server, run until killed:
//
//	probe serve NAME              HTTP on :80 and, given /certs/server.pem and /certs/server.key, HTTPS on :443:
//	                              GET /bytes/N sends N zero bytes (?rate=B: at B bytes a second), any other path answers "NAME http HOST PATH";
//	                              /h/..., /echo, /git/..., /sse and /release show and ask for credentials and stream events (serveCredentials);
//	                              TCP on :22 and :7 greets "NAME tcp PORT" then echoes lines;
//	                              UDP on :53 and :9 answers each datagram with "NAME udp PORT".
//	                              It prints "serving NAME" once listening, then one line per event:
//	                              "conn PORT from ADDR", "http HOST PATH from ADDR", "udp PORT from ADDR: PAYLOAD".
//	                              For tests on one machine, PROBE_PORT_OFFSET is added to every port it
//	                              listens on (the printed ports stay the nominal ones) and PROBE_CERT_DIR
//	                              replaces /certs.
//
// The stand-in for an LLM provider, run until killed (see provider.go):
//
//	probe provider CMD            OpenAI's Responses API on :80 (and :443, given /certs as serve's): a turn is answered with a call of the
//	                              agent's shell tool running CMD, the turn that brings the tool's output
//	                              with a final message "done: LAST LINE OF THE OUTPUT". It prints
//	                              "serving provider", then "request METHOD PATH from ADDR",
//	                              "tool call TOOL CALLID", "tool output CALLID: OUTPUT" and "final message".
//
// The stand-in for a git host over SSH, run until killed (in an image with /bin/sh and git):
//
//	probe sshd --host-key FILE --authorized-keys FILE [--port 22]
//	                              SSH on :22 that lets in only the public keys in the authorized_keys file
//	                              (any user name; no passwords, no keyboard-interactive; a connection not
//	                              authenticated within 10s is closed) and runs each "exec" request with
//	                              /bin/sh -c on the channel, sending its exit status; shells and terminals
//	                              are refused. It prints "sshd listening" once listening, then
//	                              "auth publickey USER ok|denied FINGERPRINT" per key offered and
//	                              "exec COMMAND" per command.
//
// A failing operation prints "error: ..." and exits 1.
package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: probe COMMAND [ARG...]"))
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "id":
		wd, _ := os.Getwd()
		fmt.Printf("uid=%d gid=%d cwd=%s home=%s\n", os.Getuid(), os.Getgid(), wd, os.Getenv("HOME"))
	case "env":
		for _, name := range args {
			if v, ok := os.LookupEnv(name); ok {
				fmt.Printf("%s=%s\n", name, v)
			} else {
				fmt.Printf("%s unset\n", name)
			}
		}
	case "read":
		need(args, 1)
		data, err := os.ReadFile(args[0])
		check(err)
		os.Stdout.Write(data)
	case "write":
		need(args, 2)
		check(os.WriteFile(args[0], []byte(args[1]), 0o644))
		fmt.Println("wrote", args[0])
	case "ls":
		need(args, 1)
		entries, err := os.ReadDir(args[0])
		check(err)
		names := make([]string, len(entries))
		for i, e := range entries {
			names[i] = e.Name()
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Println(n)
		}
	case "fs":
		fsOps(args)
	case "find":
		find(args)
	case "connect":
		o, args := parse("connect", args, 1, 5*time.Second, false)
		conn, err := net.DialTimeout("tcp", args[0], o.timeout)
		check(err)
		conn.SetReadDeadline(time.Now().Add(o.timeout))
		buf := make([]byte, 256)
		n, _ := conn.Read(buf)
		conn.Close()
		fmt.Printf("connected: %s\n", buf[:n])
	case "unixget":
		need(args, 2)
		unixGet(args[0], args[1])
	case "tcp":
		tcpEcho(args)
	case "udp":
		udpSend(args)
	case "dns":
		dnsQuery(args)
	case "resolve":
		resolve(args)
	case "fetch":
		fetch(args)
	case "download":
		download(args)
	case "latency":
		latency(args)
	case "serve":
		need(args, 1)
		serve(args[0])
	case "provider":
		need(args, 1)
		provider(args[0])
	case "sshd":
		sshd(args)
	case "cat":
		_, err := io.Copy(os.Stdout, os.Stdin)
		check(err)
	case "tty":
		fmt.Printf("stdin=%v stdout=%v%s\n", isTTY(os.Stdin), isTTY(os.Stdout), ttySize())
	case "winch":
		need(args, 1)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		fmt.Printf("ready%s\n", ttySize())
		deadline := time.After(time.Minute)
		for ttySize() != " size="+args[0] {
			select {
			case <-winch:
				fmt.Printf("resized%s\n", ttySize())
			case <-deadline:
				fail(fmt.Errorf("the terminal is not %s after a minute", args[0]))
			}
		}
	case "stderr":
		need(args, 1)
		fmt.Fprintln(os.Stderr, args[0])
	case "flood":
		need(args, 1)
		flood(args[0])
	case "sleep":
		need(args, 1)
		d, err := time.ParseDuration(args[0])
		check(err)
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
		fmt.Println("ready")
		select {
		case s := <-sigs:
			fmt.Println("got", s)
			os.Exit(128 + int(s.(syscall.Signal)))
		case <-time.After(d):
			fmt.Println("slept")
		}
	case "clock":
		fmt.Printf("clock %d\n", time.Now().UnixNano())
	case "exit":
		need(args, 1)
		n, err := strconv.Atoi(args[0])
		check(err)
		os.Exit(n)
	default:
		fail(fmt.Errorf("unknown command %q", os.Args[1]))
	}
}

// ttySize is " size=ROWSxCOLS" of stdout's terminal, or "".
func ttySize() string {
	ws, err := unix.IoctlGetWinsize(int(os.Stdout.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" size=%dx%d", ws.Row, ws.Col)
}

func isTTY(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func need(args []string, n int) {
	if len(args) < n {
		fail(fmt.Errorf("need %d argument(s)", n))
	}
}

func check(err error) {
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Printf("error: %v\n", err)
	os.Exit(1)
}

// flood prints size bytes to stdout, in lines of 1 KiB, then "flooded",
// and waits for a signal (a minute at most), so that the test can look at
// the engine's log of the container while it runs.
func flood(size string) {
	n, err := parseSize(size)
	check(err)
	line := []byte(strings.Repeat("propio-sandbox floods its output. ", 31) + "end\n")[:1024]
	line[1023] = '\n'
	buf := bytes.Repeat(line, 64)
	for done := int64(0); done < n; done += int64(len(buf)) {
		_, err := os.Stdout.Write(buf[:min(int64(len(buf)), n-done)])
		check(err)
	}
	fmt.Println("flooded")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	select {
	case s := <-sigs:
		os.Exit(128 + int(s.(syscall.Signal)))
	case <-time.After(time.Minute):
	}
}
