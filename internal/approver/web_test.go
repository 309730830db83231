package approver

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
)

// startWeb serves a board over f, with a decision log, until the test ends.
func startWeb(t *testing.T, f *fakeAsker) *Web {
	t.Helper()
	b := startBoard(t, nil, f)
	logDir := t.TempDir()
	path, err := decisionlog.Start(logDir, decisionlog.Header{Project: f.project, Workspace: "/ws"})
	if err != nil {
		t.Fatal(err)
	}
	lw, err := decisionlog.Append(path)
	if err != nil {
		t.Fatal(err)
	}
	lw.Write(decisionlog.Entry{Time: time.Now(), Via: "dns", Host: "deb.example.test", Allowed: true, Rule: "*.example.test", Reason: "allowed by rule"})
	lw.Close()
	w, err := NewWeb(b, logDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	waitBoard(t, b, "pending", func(s Snapshot) bool { return len(s.Pending) > 0 })
	return w
}

func do(t *testing.T, method, url string, hdr map[string]string, body string) (int, string) {
	t.Helper()
	r, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			r.Host = v
		} else {
			r.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func TestWebRefuses(t *testing.T) {
	t.Parallel()
	f := newFake("ws-1", req("r1", "a.test", 443))
	w := startWeb(t, f)
	origin := "http://" + w.host
	base := "http://" + w.host + "/"
	decision := `{"sandbox":"ws-1","id":"r1","action":"allow","scope":"run"}`
	json := map[string]string{"Origin": origin, "Content-Type": "application/json"}
	for _, tc := range []struct {
		name, method, url string
		hdr               map[string]string
		body              string
	}{
		{"no token", "GET", base, nil, ""},
		{"no token, api", "GET", base + "api/state", nil, ""},
		{"wrong token", "GET", base + strings.Repeat("0", len(w.token)) + "/", nil, ""},
		{"token as a query", "GET", base + "?token=" + w.token, nil, ""},
		{"other host name", "GET", w.URL(), map[string]string{"Host": "localhost" + strings.TrimPrefix(w.host, "127.0.0.1")}, ""},
		{"rebound name", "GET", w.URL(), map[string]string{"Host": "attacker.test"}, ""},
		{"cross-origin GET", "GET", w.URL() + "api/state", map[string]string{"Origin": "http://attacker.test"}, ""},
		{"cross-site fetch", "GET", w.URL() + "api/state", map[string]string{"Sec-Fetch-Site": "cross-site"}, ""},
		{"same-site fetch", "GET", w.URL() + "api/state", map[string]string{"Sec-Fetch-Site": "same-site"}, ""},
		{"cross-origin POST", "POST", w.URL() + "api/decide", map[string]string{"Origin": "http://127.0.0.1:1", "Content-Type": "application/json"}, decision},
		{"POST without origin", "POST", w.URL() + "api/decide", map[string]string{"Content-Type": "application/json"}, decision},
		{"POST as a form", "POST", w.URL() + "api/decide", map[string]string{"Origin": origin, "Content-Type": "text/plain"}, decision},
		{"POST without token", "POST", base + "api/decide", json, decision},
	} {
		code, body := do(t, tc.method, tc.url, tc.hdr, tc.body)
		if code != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", tc.name, code, body)
		}
	}
	if _, ok := f.decision("r1"); ok {
		t.Fatal("a refused request decided")
	}
	code, body := do(t, "POST", w.URL()+"api/decide", json, decision)
	if code != http.StatusOK {
		t.Fatalf("the page's POST: %d %s", code, body)
	}
	if d, _ := f.decision("r1"); d != (Decision{Action: Allow, Scope: Run}) {
		t.Fatalf("decision %+v", d)
	}
	code, _ = do(t, "POST", w.URL()+"api/decide", json, decision)
	if code != http.StatusNotFound {
		t.Fatalf("deciding a gone request: %d, want 404", code)
	}
	code, _ = do(t, "POST", w.URL()+"api/decide", json, `{"sandbox":"ws-1","id":"r1","action":"allow","scope":"run","extra":1}`)
	if code != http.StatusBadRequest {
		t.Fatalf("an unknown field: %d, want 400", code)
	}
}

func TestWebServes(t *testing.T) {
	t.Parallel()
	f := newFake("ws-1", req("r1", "a.test", 443))
	w := startWeb(t, f)
	if !strings.HasPrefix(w.URL(), "http://127.0.0.1:") {
		t.Fatalf("URL %s", w.URL())
	}
	for _, path := range []string{"", "app.js", "style.css"} {
		code, body := do(t, "GET", w.URL()+path, map[string]string{"Sec-Fetch-Site": "none"}, "")
		if code != 200 || body == "" {
			t.Errorf("%q: %d", path, code)
		}
	}
	code, body := do(t, "GET", w.URL()+"api/log?sandbox=ws-1", nil, "")
	var entries []decisionlog.Entry
	if code != 200 || json.Unmarshal([]byte(body), &entries) != nil || len(entries) != 1 || entries[0].Host != "deb.example.test" {
		t.Fatalf("log: %d %s", code, body)
	}
	if code, _ := do(t, "GET", w.URL()+"api/log?sandbox=../../etc", nil, ""); code != 404 {
		t.Fatalf("the log of a sandbox not served: %d", code)
	}
	// The event stream sends the board, then every change.
	resp, err := http.Get(w.URL() + "api/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if cors := resp.Header.Get("Access-Control-Allow-Origin"); cors != "" {
		t.Fatalf("CORS header %q", cors)
	}
	sc := bufio.NewScanner(resp.Body)
	next := func() Snapshot {
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var s Snapshot
				if err := json.Unmarshal([]byte(data), &s); err != nil {
					t.Fatal(err)
				}
				return s
			}
		}
		t.Fatalf("event stream ended: %v", sc.Err())
		return Snapshot{}
	}
	if s := next(); len(s.Pending) != 1 {
		t.Fatalf("first event: %+v", s)
	}
	f.push(Event{Type: "pending", Request: req("r22", "b.test", 80)})
	for s := next(); len(s.Pending) != 2; s = next() {
	}
}

// TestWebAssetsSelfContained: the page loads nothing from elsewhere.
func TestWebAssetsSelfContained(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"index.html", "app.js", "style.css"} {
		data, err := os.ReadFile(filepath.Join("web", name))
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"http://", "https://", "//cdn", "innerHTML", "eval("} {
			if strings.Contains(string(data), bad) {
				t.Errorf("web/%s contains %q", name, bad)
			}
		}
	}
}
