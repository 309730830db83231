package gatewayd

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
	"github.com/propio/propio-sandbox/internal/gateway"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// reports collects what the gateway reports, for a test to wait on.
type reports struct {
	mu    sync.Mutex
	lines []string
}

func (r *reports) add(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, line)
}

// waitServing returns the lines reported up to and with "serving on".
func (r *reports) waitServing(t *testing.T, done <-chan error) []string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		lines := append([]string(nil), r.lines...)
		r.mu.Unlock()
		if n := len(lines); n > 0 && strings.HasPrefix(lines[n-1], "serving on ") {
			return lines
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned before serving: %v; reported %q", err, lines)
		case <-deadline:
			t.Fatalf("not serving after 10s; reported %q", lines)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// freePort is a TCP port of the loopback address nothing listens on.
func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// options serves allow on the loopback address: its HTTP proxy on proxy,
// every other listener on any free port.
func options(t *testing.T, allow []string, proxy uint16, r *reports) Options {
	t.Helper()
	p, err := egress.ParsePolicy(allow, nil)
	if err != nil {
		t.Fatal(err)
	}
	bind := func(port uint16) uint16 {
		if port == gateway.DefaultHTTPProxyPort {
			return proxy
		}
		return 0
	}
	return Options{Address: loopback, Policy: p, Profile: ".propio/sandbox.yaml:3", Report: r.add, Ports: gateway.Ports{Bind: bind}}
}

// start runs the gateway of o until the test ends, and waits for it to
// serve; stop ends it and returns what Run returned.
func start(t *testing.T, o Options, r *reports) (lines []string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	t.Cleanup(cancel)
	lines = r.waitServing(t, done)
	return lines, func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return 10s after its context ended")
			return nil
		}
	}
}

// TestServeAppendsToTheLog serves a gateway as the launcher starts it, with
// the log the launcher began, and has its proxy refuse a name: the decision
// is in the log after the header, as the store reads it back.
func TestServeAppendsToTheLog(t *testing.T) {
	path, err := decisionlog.Start(t.TempDir(), decisionlog.Header{Time: time.Now().UTC(), Project: "propio-test", Workspace: "/w"})
	if err != nil {
		t.Fatal(err)
	}
	r := &reports{}
	port := freePort(t)
	o := options(t, []string{"allowed.test"}, port, r)
	o.Log = path
	lines, stop := start(t, o, r)
	if want := "serving on 127.0.0.1 (1 allow, 0 deny rules, 0 secrets; connections relayed in user space)"; lines[len(lines)-1] != want {
		t.Errorf("reported %q, want %q", lines[len(lines)-1], want)
	}

	proxy := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))}
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 10 * time.Second}
	resp, err := client.Get("http://denied.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("the proxy answered %s for a denied name", resp.Status)
	}
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	entries, err := decisionlog.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Via != "http" || entries[0].Host != "denied.test" || entries[0].Allowed {
		t.Errorf("the log holds %+v, want the one denial of denied.test", entries)
	}
}

func TestReportsWhatItCannotDo(t *testing.T) {
	r := &reports{}
	o := options(t, []string{"allowed.test"}, 0, r)
	o.Virtual = "nope"
	o.Log = filepath.Join(t.TempDir(), "log.jsonl")
	lines, stop := start(t, o, r)
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if len(lines) != 2 || !strings.HasPrefix(lines[0], `note: --virtual "nope": `) || !strings.HasSuffix(lines[0], "; relaying in user space") ||
		lines[1] != "serving on 127.0.0.1 (1 allow, 0 deny rules, 0 secrets; connections relayed in user space)" {
		t.Errorf("reported %q, want a note on --virtual and that it serves, relaying in user space", lines)
	}
}

func TestRunFails(t *testing.T) {
	for name, tc := range map[string]struct {
		tweak func(*Options)
		want  string
	}{
		"log in no directory": {func(o *Options) { o.Log = filepath.Join(t.TempDir(), "none", "log.jsonl") }, "opening the decision log: "},
		"every address":       {func(o *Options) { o.Address = netip.IPv4Unspecified() }, "want the gateway's own address"},
	} {
		t.Run(name, func(t *testing.T) {
			o := options(t, nil, 0, &reports{})
			tc.tweak(&o)
			err := Run(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
