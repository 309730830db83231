//go:build linux

package e2e

// The approval frontends, approve (a terminal UI) and ui (a local web page
// driven in a real headless Chromium), against a fake sandbox that asks
// (askfake_test.go): no engine and no gateway needed.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// approverLauncher sets the launcher once for these tests, which need no
// engine (errorsSandbox sets it at every call, which the race detector
// reports when two of them run in parallel).
var approverLauncher sync.Once

// approverSandbox is a workspace and home with a runtime directory, where
// the fake sandbox's ask socket goes.
func approverSandbox(t *testing.T) (*sandbox, string) {
	t.Helper()
	approverLauncher.Do(func() { launcher = testenv.Launcher(t) })
	s := makeSandbox(t)
	runtimeDir := filepath.Join(s.Home, "run")
	if err := os.MkdirAll(runtimeDir, 0o700); err != nil {
		t.Fatal(err)
	}
	s.Env = append(s.Env, "XDG_RUNTIME_DIR="+runtimeDir)
	return s, runtimeDir
}

// TestApproveTerminal: approve, on a terminal, lists what the sandbox asks
// live, and a key decides the selected request with its scope.
func TestApproveTerminal(t *testing.T) {
	t.Parallel()
	s, runtimeDir := approverSandbox(t)
	f := startFakeAsk(t, runtimeDir, "propio-workspace-0a1b2c3d", s.Workspace)
	f.ask("r1", "api.example.test", 443, "connect")
	term := terminalStart(t, s, "approve")
	term.waitRaw(60 * time.Second)
	term.waitFor("> api.example.test:443", 60*time.Second)
	f.awaitAttached(t, 10*time.Second)
	// A request made while approve runs shows at once.
	f.ask("r2", "cdn.example.test", 8443, "socks5")
	term.waitFor("cdn.example.test:8443", 30*time.Second)
	term.write("r")
	if d := f.awaitDecision(t, 30*time.Second); d.ID != "r1" || d.Decision != (askDecision{"allow", "run"}) {
		t.Fatalf("decision %+v, want r1 allow run", d)
	}
	term.waitFor("allow api.example.test:443: run", 30*time.Second)
	// The selection moves to what is left; d denies it once.
	term.waitFor("> cdn.example.test:8443", 30*time.Second)
	term.write("d")
	if d := f.awaitDecision(t, 30*time.Second); d.ID != "r2" || d.Decision != (askDecision{"deny", "once"}) {
		t.Fatalf("decision %+v, want r2 deny once", d)
	}
	term.waitFor("deny cdn.example.test:8443: once", 30*time.Second)
	term.write("q")
	if err := term.wait(30 * time.Second); err != nil {
		t.Fatalf("approve after q: %v\nterminal:\n%q", err, term.output())
	}
	// The terminal's own screen and cursor are given back.
	term.waitFor("\x1b[?25h\x1b[?1049l", 10*time.Second)
}

// TestUIChromium: the page of `ui`, in Debian's headless Chromium, shows
// the pending request live, and a click on "Allow for this run" posts that
// decision to the sandbox; a request without the token and a cross-origin
// POST are refused. Its screenshots are checked (size, not blank) and kept
// in the test's temporary directory; PROPIO_UI_SCREENSHOT=PATH also writes
// the one after the click there (docs/ui.png in the README is made so).
func TestUIChromium(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	s, runtimeDir := approverSandbox(t)
	const project = "propio-workspace-0a1b2c3d"
	f := startFakeAsk(t, runtimeDir, project, s.Workspace)
	f.ask("r1", "api.example.test", 443, "connect")
	f.ask("r2", "registry.example.test", 443, "http")
	uiWriteLog(t, filepath.Join(s.Home, ".local", "state", "propio-sandbox", "logs"), project, s.Workspace)

	url := uiStart(t, s)
	f.awaitAttached(t, 30*time.Second)
	root := strings.TrimSuffix(url, strings.Split(url, "/")[3]+"/")
	uiRefusals(t, url, root)

	const width, height = 1100, 760
	c := startChromium(t, width, height)
	if status := c.navigate(root); status != http.StatusForbidden {
		t.Fatalf("the page without its token: %d, want 403", status)
	}
	if status := c.navigate(url); status != http.StatusOK {
		t.Fatalf("the page: %d", status)
	}
	c.awaitSelector(`li.request[data-id="r1"]`, "api.example.test:443", 30*time.Second)
	c.awaitSelector(`li.request[data-id="r2"]`, "registry.example.test:443", 30*time.Second)
	c.awaitSelector(`#logs td`, "uploads.example.test:80", 30*time.Second)
	uiCheckPNG(t, c.screenshot(), width, height, "pending.png")

	c.click(`li.request[data-id="r1"] button[data-action="allow"][data-scope="run"]`)
	if d := f.awaitDecision(t, 30*time.Second); d.ID != "r1" || d.Decision != (askDecision{"allow", "run"}) {
		t.Fatalf("decision %+v, want r1 allow run", d)
	}
	c.awaitSelector(`#decided tr[data-id="r1"]`, "run", 30*time.Second)
	c.awaitSelector(`#pending-count`, "1", 30*time.Second)
	shot := uiCheckPNG(t, c.screenshot(), width, height, "decided.png")
	if out := os.Getenv("PROPIO_UI_SCREENSHOT"); out != "" {
		if err := os.WriteFile(out, shot, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// A page of another origin posts a decision the way a form could (a
	// simple request, no preflight): the page's server refuses it.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><script>fetch(%q, {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
			body: JSON.stringify({sandbox: %q, id: "r2", action: "allow", scope: "run"})});</script>`, url+"api/decide", project)
	}))
	defer evil.Close()
	from := c.mark()
	c.navigate(evil.URL)
	c.awaitEvent(from, "Network.responseReceived", func(p json.RawMessage) bool {
		var e struct {
			Response struct {
				URL    string `json:"url"`
				Status int    `json:"status"`
			} `json:"response"`
		}
		if json.Unmarshal(p, &e) != nil || e.Response.URL != url+"api/decide" {
			return false
		}
		if e.Response.Status != http.StatusForbidden {
			t.Errorf("the cross-origin POST: %d, want 403", e.Response.Status)
		}
		return true
	}, 30*time.Second)
	f.noDecision(t)
}

// uiStart runs `ui --no-open` in the workspace until the test ends, and
// returns the address it prints.
func uiStart(t *testing.T, s *sandbox) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	cmd := s.Command(ctx, "ui", "--no-open")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testenv.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT)
		err := cmd.Wait()
		cancel()
		if err != nil && !t.Failed() {
			t.Errorf("ui after Ctrl-C: %v\nstderr:\n%s", err, stderr.String())
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("ui printed no address: %v\nstderr:\n%s", err, stderr.String())
	}
	url := strings.TrimSpace(line)
	if !strings.HasPrefix(url, "http://127.0.0.1:") || strings.Count(url, "/") != 4 || !strings.HasSuffix(url, "/") {
		t.Fatalf("ui's address %q: want http://127.0.0.1:PORT/TOKEN/", url)
	}
	go io.Copy(io.Discard, out)
	return url
}

// uiRefusals: what is not the page's own is refused with 403, and decides
// nothing.
func uiRefusals(t *testing.T, url, root string) {
	t.Helper()
	host := strings.TrimPrefix(strings.TrimSuffix(root, "/"), "http://")
	body := `{"sandbox":"propio-workspace-0a1b2c3d","id":"r1","action":"allow","scope":"always"}`
	for _, tc := range []struct {
		name, method, url, origin, host string
	}{
		{"no token", "GET", root, "", ""},
		{"no token, the state", "GET", root + "api/state", "", ""},
		{"no token, a decision", "POST", root + "api/decide", "http://" + host, ""},
		{"another origin's POST", "POST", url + "api/decide", "http://attacker.test", ""},
		{"another host name (DNS rebinding)", "GET", url, "", "attacker.test"},
	} {
		req, err := http.NewRequest(tc.method, tc.url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		if tc.host != "" {
			req.Host = tc.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %s, want 403", tc.name, resp.Status)
		}
		if cors := resp.Header.Get("Access-Control-Allow-Origin"); cors != "" {
			t.Errorf("%s: a CORS header %q", tc.name, cors)
		}
	}
}

// uiWriteLog writes a decision log for project, as its gateway would.
func uiWriteLog(t *testing.T, dir, project, workspace string) {
	t.Helper()
	path, err := decisionlog.Start(dir, decisionlog.Header{Time: time.Now(), Project: project, Workspace: workspace, Profile: "standard"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := decisionlog.Append(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	now := time.Now()
	for i, e := range []decisionlog.Entry{
		{Via: "dns", Host: "proxy.golang.test", Allowed: true, Rule: "*.golang.test", Reason: `allowed by network.allow "*.golang.test"`},
		{Via: "connect", Host: "proxy.golang.test", Port: 443, Allowed: true, Rule: "*.golang.test", Reason: `allowed by network.allow "*.golang.test"`, BytesUp: 812, BytesDown: 20480},
		{Via: "http", Host: "uploads.example.test", Port: 80, Rule: "uploads.example.test", Reason: `denied by network.deny "uploads.example.test"`},
	} {
		e.Time, e.Client = now.Add(time.Duration(i-3)*time.Second), "198.18.0.3:4000"+fmt.Sprint(i)
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
}

// uiCheckPNG checks that a screenshot is a PNG of the page's size with
// something drawn on it, saves it in the test's temporary directory as
// name, and returns it.
func uiCheckPNG(t *testing.T, data []byte, width, height int, name string) []byte {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: not a PNG: %v", name, err)
	}
	if b := img.Bounds(); b.Dx() != width || b.Dy() != height {
		t.Fatalf("%s: %dx%d, want %dx%d", name, b.Dx(), b.Dy(), width, height)
	}
	colors, background, other := map[[3]uint32]bool{}, uiPixel(img, 0, height-1), 0
	for y := 0; y < height; y += 2 {
		for x := 0; x < width; x += 2 {
			p := uiPixel(img, x, y)
			colors[p] = true
			if p != background {
				other++
			}
		}
	}
	// Text, buttons in two colours, tables: many colours (anti-aliasing),
	// and a good part of the page not the background.
	if len(colors) < 32 || other < width*height/4/50 {
		t.Fatalf("%s looks blank: %d colours, %d of %d sampled pixels not the background", name, len(colors), other, width*height/4)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s: %dx%d, %d colours, saved as %s", name, width, height, len(colors), path)
	return data
}

func uiPixel(img image.Image, x, y int) [3]uint32 {
	r, g, b, _ := img.At(x, y).RGBA()
	return [3]uint32{r, g, b}
}
