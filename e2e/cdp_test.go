//go:build linux

package e2e

// A tiny client of the Chrome DevTools Protocol over --remote-debugging-pipe:
// Debian's headless chromium reads commands from its descriptor 3 and writes
// answers and events to its descriptor 4, each a JSON message ended by a NUL
// byte. No websocket, no dependency.

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

type cdpMessage struct {
	ID        int             `json:"id,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// chromium is a headless Chromium the test drives, with one page attached.
type chromium struct {
	t       *testing.T
	cmd     *exec.Cmd
	toIn    *os.File // its descriptor 3
	stderr  *testenv.Buffer
	session string

	mu      sync.Mutex
	next    int
	calls   map[int]chan cdpMessage
	events  []cdpMessage
	changed chan struct{} // closed at the next event
}

// chromiumPath is Debian's chromium; without it the test skips, or fails
// under PROPIO_E2E=require (CI installs it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("PROPIO_E2E") == "require" {
		t.Fatal("PROPIO_E2E=require, but there is no chromium (Debian: apt-get install chromium)")
	}
	t.Skip("skipping: no chromium (Debian: apt-get install chromium); set PROPIO_E2E=require to fail instead")
	return ""
}

// startChromium starts a headless Chromium with a page of width×height. It
// resolves no name but localhost (--host-resolver-rules), so that it can
// reach nothing but the test's own servers on the loopback, and runs
// nothing in the background (updates, sync, metrics).
func startChromium(t *testing.T, width, height int) *chromium {
	t.Helper()
	bin := chromiumPath(t)
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{
		"--headless", "--remote-debugging-pipe", "--user-data-dir=" + t.TempDir(),
		"--disable-gpu", "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
		"--disable-client-side-phishing-detection", "--disable-domain-reliability", "--no-pings",
		"--metrics-recording-only", "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
		"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
		"--hide-scrollbars", "--force-device-scale-factor=1", fmt.Sprintf("--window-size=%d,%d", width, height),
	}
	if os.Geteuid() == 0 {
		args = append(args, "--no-sandbox") // Chromium's sandbox refuses to run as root
	}
	cmd := exec.Command(bin, append(args, "about:blank")...)
	cmd.ExtraFiles = []*os.File{inR, outW}
	c := &chromium{t: t, cmd: cmd, toIn: inW, stderr: &testenv.Buffer{}, calls: map[int]chan cdpMessage{}, changed: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.stderr, c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	inR.Close()
	outW.Close()
	go c.read(outR)
	t.Cleanup(func() {
		inW.Close() // chromium exits when its pipe closes
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("chromium's output:\n%s", c.stderr.String())
		}
	})
	c.attach(width, height)
	return c
}

func (c *chromium) read(r *os.File) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes(0)
		if err != nil {
			return
		}
		var m cdpMessage
		if json.Unmarshal(line[:len(line)-1], &m) != nil {
			continue
		}
		c.mu.Lock()
		if m.ID != 0 {
			if ch := c.calls[m.ID]; ch != nil {
				ch <- m
				delete(c.calls, m.ID)
			}
		} else {
			c.events = append(c.events, m)
			close(c.changed)
			c.changed = make(chan struct{})
		}
		c.mu.Unlock()
	}
}

// call sends method with params to the page's session (or the browser,
// with session ""), and decodes its result into result (when not nil).
func (c *chromium) call(session, method string, params, result any) {
	c.t.Helper()
	if params == nil {
		params = struct{}{}
	}
	p, err := json.Marshal(params)
	if err != nil {
		c.t.Fatal(err)
	}
	ch := make(chan cdpMessage, 1)
	c.mu.Lock()
	c.next++
	id := c.next
	c.calls[id] = ch
	c.mu.Unlock()
	msg, _ := json.Marshal(cdpMessage{ID: id, SessionID: session, Method: method, Params: p})
	if _, err := c.toIn.Write(append(msg, 0)); err != nil {
		c.t.Fatalf("%s: writing to chromium: %v", method, err)
	}
	select {
	case m := <-ch:
		if m.Error != nil {
			c.t.Fatalf("%s: %s", method, m.Error.Message)
		}
		if result != nil {
			if err := json.Unmarshal(m.Result, result); err != nil {
				c.t.Fatalf("%s: %v", method, err)
			}
		}
	case <-time.After(60 * time.Second):
		c.t.Fatalf("%s: no answer from chromium within 60s; its output:\n%s", method, c.stderr.String())
	}
}

// do calls method on the attached page.
func (c *chromium) do(method string, params, result any) {
	c.t.Helper()
	c.call(c.session, method, params, result)
}

// attach creates a page of width×height and attaches to it.
func (c *chromium) attach(width, height int) {
	c.t.Helper()
	var target struct {
		TargetID string `json:"targetId"`
	}
	c.call("", "Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var att struct {
		SessionID string `json:"sessionId"`
	}
	c.call("", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att)
	c.session = att.SessionID
	for _, m := range []string{"Page.enable", "Runtime.enable", "Network.enable"} {
		c.do(m, nil, nil)
	}
	c.do("Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}, nil)
}

// mark is where in the event log to start waiting from.
func (c *chromium) mark() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.events)
}

// awaitEvent waits for an event of method after mark that match accepts.
func (c *chromium) awaitEvent(from int, method string, match func(json.RawMessage) bool, timeout time.Duration) json.RawMessage {
	c.t.Helper()
	deadline := time.After(timeout)
	for {
		c.mu.Lock()
		for ; from < len(c.events); from++ {
			if e := c.events[from]; e.Method == method && (e.SessionID == c.session || e.SessionID == "") && (match == nil || match(e.Params)) {
				c.mu.Unlock()
				return e.Params
			}
		}
		changed := c.changed
		c.mu.Unlock()
		select {
		case <-changed:
		case <-deadline:
			c.t.Fatalf("no %s within %s", method, timeout)
		}
	}
}

// navigate loads url and waits for its load event; it returns the status
// of the document's response.
func (c *chromium) navigate(url string) int {
	c.t.Helper()
	from := c.mark()
	var nav struct {
		ErrorText string `json:"errorText"`
	}
	c.do("Page.navigate", map[string]any{"url": url}, &nav)
	if nav.ErrorText != "" {
		c.t.Fatalf("navigating to %s: %s", url, nav.ErrorText)
	}
	resp := c.awaitEvent(from, "Network.responseReceived", func(p json.RawMessage) bool {
		var e struct {
			Type     string `json:"type"`
			Response struct {
				URL string `json:"url"`
			} `json:"response"`
		}
		return json.Unmarshal(p, &e) == nil && e.Type == "Document"
	}, 30*time.Second)
	c.awaitEvent(from, "Page.loadEventFired", nil, 30*time.Second)
	var e struct {
		Response struct {
			Status int `json:"status"`
		} `json:"response"`
	}
	json.Unmarshal(resp, &e)
	return e.Response.Status
}

// eval evaluates a JavaScript expression in the page, awaiting it when it
// is a promise, and decodes its value into result (when not nil).
func (c *chromium) eval(expr string, result any) {
	c.t.Helper()
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	c.do("Runtime.evaluate", map[string]any{"expression": expr, "awaitPromise": true, "returnByValue": true}, &r)
	if r.ExceptionDetails != nil {
		c.t.Fatalf("evaluating %s: %s %s", expr, r.ExceptionDetails.Text, r.ExceptionDetails.Exception.Description)
	}
	if result != nil {
		if err := json.Unmarshal(r.Result.Value, result); err != nil {
			c.t.Fatalf("evaluating %s: %v (%s)", expr, err, r.Result.Value)
		}
	}
}

// awaitSelector waits, on the page's own mutations, until an element
// matches selector (and, when text is not empty, contains text), within
// timeout.
func (c *chromium) awaitSelector(selector, text string, timeout time.Duration) {
	c.t.Helper()
	sel, _ := json.Marshal(selector)
	txt, _ := json.Marshal(text)
	expr := fmt.Sprintf(`new Promise((resolve) => {
		const found = () => [...document.querySelectorAll(%s)].some((e) => e.textContent.includes(%s));
		if (found()) return resolve(true);
		const timer = setTimeout(() => { obs.disconnect(); resolve(false); }, %d);
		const obs = new MutationObserver(() => { if (found()) { clearTimeout(timer); obs.disconnect(); resolve(true); } });
		obs.observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
	})`, sel, txt, timeout.Milliseconds())
	var ok bool
	c.eval(expr, &ok)
	if !ok {
		var body string
		c.eval("document.body ? document.body.innerText : ''", &body)
		c.t.Fatalf("no %s with %q on the page within %s; it shows:\n%s", selector, text, timeout, body)
	}
}

// click clicks the middle of the element selector matches, as a mouse
// does.
func (c *chromium) click(selector string) {
	c.t.Helper()
	x, y := c.pointAt(selector)
	for _, typ := range []string{"mouseMoved", "mousePressed", "mouseReleased"} {
		c.mouse(typ, x, y)
	}
}

// pointAt scrolls the element selector matches into view and returns its
// middle.
func (c *chromium) pointAt(selector string) (x, y float64) {
	c.t.Helper()
	sel, _ := json.Marshal(selector)
	var box struct{ X, Y float64 }
	c.eval(fmt.Sprintf(`(() => { const e = document.querySelector(%s); e.scrollIntoView({block: "center"});
		const r = e.getBoundingClientRect(); return {X: r.x + r.width / 2, Y: r.y + r.height / 2}; })()`, sel), &box)
	return box.X, box.Y
}

// mouse sends one mouse event of typ (mouseMoved, mousePressed,
// mouseReleased) at x, y, with the left button.
func (c *chromium) mouse(typ string, x, y float64) {
	c.t.Helper()
	c.do("Input.dispatchMouseEvent", map[string]any{"type": typ, "x": x, "y": y, "button": "left", "clickCount": 1}, nil)
}

// screenshot returns a PNG of the page's viewport.
func (c *chromium) screenshot() []byte {
	c.t.Helper()
	var r struct {
		Data string `json:"data"`
	}
	c.do("Page.captureScreenshot", map[string]any{"format": "png"}, &r)
	png, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil {
		c.t.Fatal(err)
	}
	return png
}
