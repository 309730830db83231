package sandbox

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/portrelay"
)

// fakePorts is a Ports over a fake runtime whose relays really relay, in
// this process, to 127.0.0.1 (the test's own servers stand for the
// sandbox's), until they are removed.
func fakePorts(t *testing.T) (*Ports, *fakeRuntime) {
	t.Helper()
	f := newFake(t)
	var mu sync.Mutex
	stops := map[string]context.CancelFunc{}
	var wg sync.WaitGroup
	f.relay = func(id string, r backend.Relay) {
		ctx, cancel := context.WithCancel(context.Background())
		mu.Lock()
		stops[id] = cancel
		mu.Unlock()
		var port int
		fmt.Sscan(r.Command[len(r.Command)-1], &port)
		sock := filepath.Join(r.Dir, path.Base(r.Command[2]))
		wg.Add(1)
		go func() {
			defer wg.Done()
			portrelay.Serve(ctx, sock, port)
		}()
	}
	f.on["RemoveContainer"] = func(context.Context) error { return nil }
	dir, err := os.MkdirTemp("", "ports") // short: a socket's path
	if err != nil {
		t.Fatal(err)
	}
	p := &Ports{
		rt: f, project: "demo", labels: map[string]string{backend.LabelProject: "demo"},
		user: "1000:1000", local: true,
		image:  func(context.Context) (string, error) { return gatewayImage, nil },
		fixed:  map[int]string{8443: "127.0.0.1:8443"},
		engine: enginePorts("tcp://127.0.0.1:12375"),
		dir:    filepath.Join(dir, "demo"),
		open:   map[int]*published{},
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	t.Cleanup(func() {
		p.Close()
		mu.Lock()
		for _, stop := range stops {
			stop()
		}
		mu.Unlock()
		wg.Wait()
		os.RemoveAll(dir)
	})
	return p, f
}

// server is an HTTP server on 127.0.0.1 that says hello; it returns its port.
func server(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello from the sandbox")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

func get(t *testing.T, url string) (string, error) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestPortPublish(t *testing.T) {
	p, f := fakePorts(t)
	port := server(t)
	ctx := context.Background()
	if err := p.Check(ask.Request{Kind: "port", Port: port}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	res, err := p.Handle(ctx, ask.Request{Kind: "port", Port: port, Reason: "preview"})
	if err != nil {
		t.Fatal(err)
	}
	url, _ := res["url"].(string)
	host, _ := res["host_port"].(int)
	// The port is taken on the host (by the test's server): another one.
	if host == 0 || host == port || url != fmt.Sprintf("http://127.0.0.1:%d", host) {
		t.Fatalf("result %v: want the URL of another free host port", res)
	}
	if body, err := get(t, url); err != nil || body != "hello from the sandbox" {
		t.Fatalf("GET %s: %q, %v", url, body, err)
	}
	if r := f.relays; len(r) != 1 {
		t.Fatalf("relays %v, want one", r)
	}
	for _, r := range f.relays {
		if r.Project != "demo" || r.Image != gatewayImage || r.Dir != p.dir || r.User != "1000:1000" || r.Labels[backend.LabelProject] != "demo" {
			t.Errorf("relay %+v", r)
		}
		if st, err := os.Stat(r.Dir); err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("the relays' directory: %v, %v; want mode 0700", st.Mode(), err)
		}
	}

	// Refused: published already, by a request or the profile; not a port.
	for _, tc := range []struct {
		port int
		want string
	}{
		{port, "published already, at " + url},
		{8443, "by the profile's ports"},
		{0, "not a port"},
		{65536, "not a port"},
		{80, "privileged on the host"},
		{1023, "privileged on the host"},
		{2375, "engine's API port"},
		{2376, "engine's API port"},
		{12375, "engine's API port"}, // DOCKER_HOST's
	} {
		if err := p.Check(ask.Request{Kind: "port", Port: tc.port}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check port %d: error %v, want %q", tc.port, err, tc.want)
		}
		if _, err := p.Handle(ctx, ask.Request{Kind: "port", Port: tc.port}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("port %d: error %v, want %q", tc.port, err, tc.want)
		}
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, url); err == nil {
		t.Errorf("%s still answers after Close", url)
	}
	if len(f.relays) != 0 {
		t.Errorf("relays left after Close: %v", f.relays)
	}
	if _, err := os.Stat(p.dir); !os.IsNotExist(err) {
		t.Errorf("the relays' directory remains after Close: %v", err)
	}
	if _, err := p.Handle(ctx, ask.Request{Kind: "port", Port: port + 1}); err == nil || !strings.Contains(err.Error(), "ended") {
		t.Errorf("a request after Close: %v, want the sandbox has ended", err)
	}
}

// TestPortSameNumber: a port free on the host is published at the same
// number.
func TestPortSameNumber(t *testing.T) {
	p, _ := fakePorts(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // free now
	res, err := p.Handle(context.Background(), ask.Request{Kind: "port", Port: port})
	if err != nil {
		t.Fatal(err)
	}
	if res["host_port"] != port {
		t.Errorf("host port %v, want %d", res["host_port"], port)
	}
}

// TestPortRelayFails: a relay that never serves, or cannot start, leaves
// nothing published and nothing running.
func TestPortRelayFails(t *testing.T) {
	p, f := fakePorts(t)
	f.relay = nil // never serves its socket
	f.on["StartRelay"] = func(context.Context) error { return fmt.Errorf("no running agent container") }
	if _, err := p.Handle(context.Background(), ask.Request{Kind: "port", Port: 3000}); err == nil || !strings.Contains(err.Error(), "publishing port 3000: no running agent container") {
		t.Fatalf("error %v", err)
	}
	if len(p.open) != 0 || len(f.relays) != 0 {
		t.Errorf("left: open %v, relays %v", p.open, f.relays)
	}
	// It can be asked again.
	delete(f.on, "StartRelay")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := p.Handle(ctx, ask.Request{Kind: "port", Port: 3000}); err == nil || !strings.Contains(err.Error(), "did not serve its socket") {
		t.Fatalf("error %v", err)
	}
	if len(p.open) != 0 || len(f.relays) != 0 {
		t.Errorf("left: open %v, relays %v", p.open, f.relays)
	}
}

func TestPortRemoteEngine(t *testing.T) {
	p, _ := fakePorts(t)
	p.local = false
	if _, err := p.Handle(context.Background(), ask.Request{Kind: "port", Port: 3000}); err == nil || !strings.Contains(err.Error(), "not run on this host") {
		t.Fatalf("error %v", err)
	}
}

func TestEnginePorts(t *testing.T) {
	for host, want := range map[string][]int{
		"unix:///var/run/docker.sock": {2375, 2376},
		"tcp://10.0.0.5:4243":         {2375, 2376, 4243},
		"tcp://[::1]:2377":            {2375, 2376, 2377},
		"ssh://me@host.test":          {2375, 2376},
		"":                            {2375, 2376},
	} {
		got := enginePorts(host)
		if len(got) != len(want) {
			t.Errorf("enginePorts(%q) = %v, want %v", host, got, want)
		}
		for _, p := range want {
			if !got[p] {
				t.Errorf("enginePorts(%q) = %v, want %v", host, got, want)
			}
		}
	}
}
