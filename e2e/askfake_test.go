//go:build linux

package e2e

// A fake sandbox that asks: the ask protocol's HTTP server on a unix socket
// in the ask directory where the frontends look for sandboxes
// ($XDG_RUNTIME_DIR/propio-sandbox/ask/PROJECT/ask.sock, beside its
// sandbox.json), so that approve and ui can be tested without a gateway.
// It speaks the wire protocol only: GET /v1/requests, GET /v1/watch
// (NDJSON events, the pending requests first), POST /v1/requests/{id}.

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

type askRequest struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	Host      string    `json:"host"`
	Port      int       `json:"port"`
	Via       string    `json:"via"`
	Project   string    `json:"project"`
	Workspace string    `json:"workspace"`
	Reason    string    `json:"reason"`
	Created   time.Time `json:"created"`
}

type askDecision struct {
	Action string `json:"action"`
	Scope  string `json:"scope"`
}

type askEvent struct {
	Type      string       `json:"type"`
	Request   askRequest   `json:"request"`
	Decision  *askDecision `json:"decision,omitempty"`
	DecidedBy string       `json:"decided_by,omitempty"`
}

// askDecided is a decision the fake received.
type askDecided struct {
	ID       string
	Decision askDecision
}

type fakeAsk struct {
	project, workspace string

	mu        sync.Mutex
	pending   []askRequest
	watchers  map[chan askEvent]bool
	attached  chan struct{} // closed when the first watch attaches
	once      sync.Once
	decisions chan askDecided
}

// startFakeAsk serves a sandbox named project of workspace in runtimeDir's
// ask directory until the test ends.
func startFakeAsk(t *testing.T, runtimeDir, project, workspace string) *fakeAsk {
	t.Helper()
	dir := filepath.Join(runtimeDir, "propio-sandbox", "ask", project)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	meta, _ := json.Marshal(map[string]string{"project": project, "workspace": workspace})
	if err := os.WriteFile(filepath.Join(dir, "sandbox.json"), meta, 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "ask.sock"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAsk{project: project, workspace: workspace, watchers: map[chan askEvent]bool{},
		attached: make(chan struct{}), decisions: make(chan askDecided, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/requests", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		json.NewEncoder(w).Encode(append([]askRequest{}, f.pending...))
	})
	mux.HandleFunc("GET /v1/watch", f.watch)
	mux.HandleFunc("POST /v1/requests/{id}", f.decide)
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.mu.Lock()
		for w := range f.watchers {
			close(w)
		}
		f.watchers = map[chan askEvent]bool{}
		f.mu.Unlock()
		srv.Shutdown(ctx)
	})
	return f
}

// ask makes a request pending, as a held connection does.
func (f *fakeAsk) ask(id, host string, port int, via string) {
	r := askRequest{ID: id, Kind: "network", Host: host, Port: port, Via: via, Project: f.project, Workspace: f.workspace,
		Reason: "no network.allow rule matches", Created: time.Now()}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = append(f.pending, r)
	for w := range f.watchers {
		w <- askEvent{Type: "pending", Request: r}
	}
}

func (f *fakeAsk) watch(w http.ResponseWriter, r *http.Request) {
	ch := make(chan askEvent, 64)
	f.mu.Lock()
	for _, p := range f.pending {
		ch <- askEvent{Type: "pending", Request: p}
	}
	f.watchers[ch] = true
	f.mu.Unlock()
	f.once.Do(func() { close(f.attached) })
	defer func() {
		f.mu.Lock()
		if f.watchers[ch] {
			delete(f.watchers, ch)
		}
		f.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.(http.Flusher).Flush()
	enc := json.NewEncoder(w)
	for {
		select {
		case <-r.Context().Done():
			return
		case e, ok := <-ch:
			if !ok {
				return
			}
			if enc.Encode(e) != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}
}

func (f *fakeAsk) decide(w http.ResponseWriter, r *http.Request) {
	var d askDecision
	if err := json.NewDecoder(r.Body).Decode(&d); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := r.PathValue("id")
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.pending, func(p askRequest) bool { return p.ID == id })
	if i < 0 {
		http.Error(w, "no pending request "+id, http.StatusNotFound)
		return
	}
	req := f.pending[i]
	f.pending = slices.Delete(f.pending, i, i+1)
	for ch := range f.watchers {
		ch <- askEvent{Type: "decided", Request: req, Decision: &d, DecidedBy: "user"}
	}
	f.decisions <- askDecided{ID: id, Decision: d}
}

// expire decides the pending request id by its timeout, as a gateway does.
func (f *fakeAsk) expire(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.pending, func(p askRequest) bool { return p.ID == id })
	if i < 0 {
		return
	}
	req := f.pending[i]
	f.pending = slices.Delete(f.pending, i, i+1)
	for ch := range f.watchers {
		ch <- askEvent{Type: "decided", Request: req, Decision: &askDecision{"deny", "once"}, DecidedBy: "timeout"}
	}
}

// awaitAttached waits until a frontend watches the sandbox.
func (f *fakeAsk) awaitAttached(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-f.attached:
	case <-time.After(timeout):
		t.Fatalf("no approver attached to %s within %s", f.project, timeout)
	}
}

// awaitDecision returns the next decision the fake receives.
func (f *fakeAsk) awaitDecision(t *testing.T, timeout time.Duration) askDecided {
	t.Helper()
	select {
	case d := <-f.decisions:
		return d
	case <-time.After(timeout):
		t.Fatalf("no decision reached %s within %s", f.project, timeout)
	}
	return askDecided{}
}

// noDecision fails when a decision has reached the fake.
func (f *fakeAsk) noDecision(t *testing.T) {
	t.Helper()
	select {
	case d := <-f.decisions:
		t.Fatalf("a decision reached %s: %+v", f.project, d)
	default:
	}
}
