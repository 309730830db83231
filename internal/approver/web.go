package approver

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
)

//go:embed web
var webFS embed.FS

// Web serves a Board as a page on 127.0.0.1, on a port of its own, to
// whoever has the token in its URL: every path starts with /TOKEN/. It
// refuses (403) a request without the token, for another host name than
// 127.0.0.1:PORT (DNS rebinding), from another origin (Origin,
// Sec-Fetch-Site), and a decision that is not a same-origin JSON POST. It
// sends no CORS headers.
type Web struct {
	board  *Board
	logDir string
	ln     net.Listener
	token  string
	host   string // 127.0.0.1:PORT
}

// NewWeb listens on a random port of 127.0.0.1 for board; the page shows the
// decision logs of logDir.
func NewWeb(board *Board, logDir string) (*Web, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening on 127.0.0.1: %w", err)
	}
	tok := make([]byte, 24)
	if _, err := rand.Read(tok); err != nil {
		ln.Close()
		return nil, err
	}
	return &Web{board: board, logDir: logDir, ln: ln, token: hex.EncodeToString(tok), host: ln.Addr().String()}, nil
}

// URL is the page's address, token included.
func (w *Web) URL() string { return "http://" + w.host + "/" + w.token + "/" }

// Serve serves the page until ctx ends.
func (w *Web) Serve(ctx context.Context) error {
	srv := &http.Server{Handler: w, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	err := srv.Serve(w.ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func forbidden(rw http.ResponseWriter, why string) {
	http.Error(rw, "forbidden: "+why, http.StatusForbidden)
}

// refused says why r is refused, or "" when it is not.
func (w *Web) refused(r *http.Request) string {
	if r.Host != w.host {
		return "wrong host"
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/")
	tok, _, _ := strings.Cut(rest, "/")
	if !ok || subtle.ConstantTimeCompare([]byte(tok), []byte(w.token)) != 1 {
		return "no token"
	}
	if o := r.Header.Get("Origin"); o != "" && o != "http://"+w.host {
		return "cross-origin"
	}
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return "cross-site"
	}
	if r.Method == http.MethodPost && (r.Header.Get("Origin") != "http://"+w.host || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json")) {
		return "not a same-origin JSON request"
	}
	return ""
}

func (w *Web) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	h := rw.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	if why := w.refused(r); why != "" {
		forbidden(rw, why)
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/"+w.token+"/")
	switch {
	case r.Method == http.MethodPost && path == "api/decide":
		w.decide(rw, r)
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		http.Error(rw, "method not allowed", http.StatusMethodNotAllowed)
	case path == "api/state":
		s, _ := w.board.Snapshot()
		writeJSON(rw, s)
	case path == "api/events":
		w.events(rw, r)
	case path == "api/log":
		w.log(rw, r)
	case path == "" || path == "index.html" || path == "app.js" || path == "style.css":
		w.asset(rw, path)
	default:
		http.NotFound(rw, r)
	}
}

func (w *Web) asset(rw http.ResponseWriter, path string) {
	if path == "" {
		path = "index.html"
	}
	data, err := fs.ReadFile(webFS, "web/"+path)
	if err != nil {
		http.NotFound(rw, nil)
		return
	}
	switch {
	case strings.HasSuffix(path, ".html"):
		rw.Header().Set("Content-Type", "text/html; charset=utf-8")
	case strings.HasSuffix(path, ".js"):
		rw.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	case strings.HasSuffix(path, ".css"):
		rw.Header().Set("Content-Type", "text/css; charset=utf-8")
	}
	rw.Write(data)
}

func writeJSON(rw http.ResponseWriter, v any) {
	rw.Header().Set("Content-Type", "application/json")
	json.NewEncoder(rw).Encode(v)
}

// events streams the board's snapshots as server-sent events, one at every
// change.
func (w *Web) events(rw http.ResponseWriter, r *http.Request) {
	fl, ok := rw.(http.Flusher)
	if !ok {
		http.Error(rw, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "text/event-stream")
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	for {
		s, changed := w.board.Snapshot()
		data, err := json.Marshal(s)
		if err != nil {
			return
		}
		if _, err := fmt.Fprintf(rw, "data: %s\n\n", data); err != nil {
			return
		}
		fl.Flush()
		if !w.await(rw, r, changed, keepalive.C) {
			return
		}
	}
}

// await waits for the board's change, sending keepalives meanwhile; false
// when the page has gone.
func (w *Web) await(rw http.ResponseWriter, r *http.Request, changed <-chan struct{}, tick <-chan time.Time) bool {
	for {
		select {
		case <-r.Context().Done():
			return false
		case <-changed:
			return true
		case <-tick:
			if _, err := io.WriteString(rw, ": keepalive\n\n"); err != nil {
				return false
			}
			rw.(http.Flusher).Flush()
		}
	}
}

// decisionRequest is what the page posts.
type decisionRequest struct {
	Sandbox string `json:"sandbox"`
	ID      string `json:"id"`
	Decision
}

func (w *Web) decide(rw http.ResponseWriter, r *http.Request) {
	var d decisionRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		http.Error(rw, "bad decision: "+err.Error(), http.StatusBadRequest)
		return
	}
	err := w.board.Decide(r.Context(), d.Sandbox, d.ID, d.Decision)
	switch {
	case errors.Is(err, ErrGone):
		http.Error(rw, err.Error(), http.StatusNotFound)
	case errors.Is(err, ErrNoGrants):
		http.Error(rw, err.Error(), http.StatusConflict)
	case err != nil:
		http.Error(rw, err.Error(), http.StatusBadGateway)
	default:
		writeJSON(rw, map[string]bool{"ok": true})
	}
}

// logTail is how many of a log's last entries the page shows.
const logTail = 200

// log returns the last entries of the decision log of a sandbox the board
// is attached to (?sandbox=PROJECT), newest first.
func (w *Web) log(rw http.ResponseWriter, r *http.Request) {
	project := r.URL.Query().Get("sandbox")
	s, _ := w.board.Snapshot()
	known := false
	for _, sb := range s.Sandboxes {
		known = known || sb.Project == project
	}
	if !known {
		http.NotFound(rw, r)
		return
	}
	entries, err := decisionlog.Read(decisionlog.Path(w.logDir, project))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	if len(entries) > logTail {
		entries = entries[len(entries)-logTail:]
	}
	out := make([]decisionlog.Entry, 0, len(entries))
	for i := len(entries) - 1; i >= 0; i-- {
		out = append(out, entries[i])
	}
	writeJSON(rw, out)
}
