package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/decisionlog"
)

// The agent's requests through the launcher's sockets, with an approver
// attached through the ask client (as requests --watch is) and a Resizer
// over a recorded update.

type agentFixture struct {
	srv      *AgentServer
	sandbox  ask.Sandbox
	logPath  string
	updates  chan backend.Resources
	agentDir string
}

func newAgentFixture(t *testing.T, kinds ...string) *agentFixture {
	t.Helper()
	dir := t.TempDir()
	askDir, err := ask.Make(filepath.Join(dir, "ask"), "p1", "/w")
	if err != nil {
		t.Fatal(err)
	}
	agentDir, err := ask.MakeAgentDir(filepath.Join(dir, "agent"), "p1")
	if err != nil {
		t.Fatal(err)
	}
	logPath, err := decisionlog.Start(dir, decisionlog.Header{Project: "p1", Workspace: "/w"})
	if err != nil {
		t.Fatal(err)
	}
	log, err := decisionlog.Append(logPath)
	if err != nil {
		t.Fatal(err)
	}
	f := &agentFixture{logPath: logPath, updates: make(chan backend.Resources, 4), agentDir: agentDir}
	z := NewResizer(backend.Resources{CPUs: 1, Memory: 512 << 20, PIDs: 100}, backend.Resources{CPUs: 2, Memory: 4 << 30, PIDs: 1000},
		func(ctx context.Context, r backend.Resources) error { f.updates <- r; return nil })
	hs := &Handlers{}
	hs.Register(ask.KindResources, z.Handle)
	hs.Check(ask.KindResources, z.Check)
	f.srv = &AgentServer{Kinds: kinds, Handlers: hs, Log: log, AgentDir: agentDir, AskDir: askDir,
		Broker: &ask.Broker{Project: "p1", Workspace: "/w", Timeout: 5 * time.Second, Prefix: "a"}}
	if err := f.srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.srv.Close(); log.Close() })
	f.sandbox, err = ask.Open(askDir)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// post sends body to request.sock as the agent does, and returns the answer.
func (f *agentFixture) post(t *testing.T, body string) ask.Answer {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return new(net.Dialer).DialContext(ctx, "unix", filepath.Join(f.agentDir, ask.AgentSocketName))
	}}}
	resp, err := c.Post("http://sandbox/v1/requests", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a ask.Answer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	return a
}

// approve attaches as an approver and answers each pending request with
// decide; it returns once attached.
func (f *agentFixture) approve(t *testing.T, decide func(ask.Request) ask.Decision) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	attached := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.sandbox.WatchAttached(ctx, func() { close(attached) }, func(ev ask.Event) {
			if ev.Type == ask.EventPending {
				go f.sandbox.Decide(ctx, ev.Request.ID, decide(ev.Request))
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	<-attached
}

func TestAgentRequestNoApprover(t *testing.T) {
	f := newAgentFixture(t, "resources")
	a := f.post(t, `{"kind":"resources","resources":{"memory":1073741824},"reason":"a big build"}`)
	if a.Decision != ask.Deny || a.DecidedBy != ask.ByNoApprover || a.Error == "" {
		t.Fatalf("answer %+v, want deny by no-approver", a)
	}
	if len(f.updates) != 0 {
		t.Fatal("resources updated without an approver")
	}
	entries, err := decisionlog.Read(f.logPath)
	if err != nil || len(entries) != 1 {
		t.Fatalf("log %v %+v", err, entries)
	}
	if e := entries[0]; e.Kind != "resources" || e.Via != "agent" || e.Allowed || e.DecidedBy != ask.ByNoApprover || e.Asked != "memory 1GiB" || e.Reason != "a big build" {
		t.Errorf("entry %+v", e)
	}
}

func TestAgentRequestAllowed(t *testing.T) {
	f := newAgentFixture(t, "resources")
	var seen ask.Request
	f.approve(t, func(r ask.Request) ask.Decision {
		seen = r
		return ask.Decision{Action: ask.Allow, Scope: ask.ScopeOnce}
	})
	a := f.post(t, `{"kind":"resources","resources":{"memory":2147483648,"pids":500},"reason":"a big build"}`)
	if a.Decision != ask.Allow || a.DecidedBy != ask.ByUser || a.Error != "" {
		t.Fatalf("answer %+v", a)
	}
	if got := <-f.updates; got != (backend.Resources{Memory: 2 << 30, PIDs: 500}) {
		t.Errorf("update %+v", got)
	}
	if a.Result["memory"] != float64(2<<30) || a.Result["pids"] != float64(500) || a.Result["cpus"] != float64(1) {
		t.Errorf("result %v", a.Result)
	}
	if !strings.HasPrefix(seen.ID, "a") || seen.Kind != "resources" || seen.Via != "agent" || seen.Project != "p1" || seen.Reason != "a big build" || seen.What() != "memory 2GiB, pids 500" {
		t.Errorf("the approver saw %+v", seen)
	}
	// Lower than now, above the bounds, nothing raised: refused without
	// asking, by rule, saying why.
	for body, want := range map[string]string{
		`{"kind":"resources","resources":{"pids":200},"reason":"x"}`:          "below the current limit of 500",
		`{"kind":"resources","resources":{"memory":8589934592},"reason":"x"}`: "above the maximum of 4GiB",
		`{"kind":"resources","resources":{"pids":500},"reason":"x"}`:          "nothing to raise",
		`{"kind":"port","port":3000,"reason":"x"}`:                            "does not let the agent ask for port",
		`{"kind":"resources","resources":{"pids":600}}`:                       "reason",
		`{"kind":"disk","reason":"x"}`:                                        `kind "disk"`,
	} {
		a := f.post(t, body)
		if a.Decision != ask.Deny || a.DecidedBy != ask.ByRule || !strings.Contains(a.Error, want) {
			t.Errorf("%s: answer %+v, want deny by rule saying %q", body, a, want)
		}
	}
	if len(f.updates) != 0 {
		t.Error("a refused request updated the limits")
	}
}

func TestAgentRequestDenied(t *testing.T) {
	f := newAgentFixture(t, "resources", "port")
	f.approve(t, func(ask.Request) ask.Decision { return ask.Decision{Action: ask.Deny, Scope: ask.ScopeOnce} })
	a := f.post(t, `{"kind":"resources","resources":{"cpus":2},"reason":"faster tests"}`)
	if a.Decision != ask.Deny || a.DecidedBy != ask.ByUser {
		t.Fatalf("answer %+v", a)
	}
	// A kind the profile names but this launcher has no handler for.
	a = f.post(t, `{"kind":"port","port":3000,"reason":"preview"}`)
	if a.Decision != ask.Deny || !strings.Contains(a.Error, "does not carry out port requests") {
		t.Errorf("answer %+v", a)
	}
}

func TestAgentDirHoldsNoApprovalSocket(t *testing.T) {
	f := newAgentFixture(t, "resources")
	ents, err := os.ReadDir(f.agentDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != ask.AgentSocketName {
		t.Fatalf("the agent's directory holds %v, want request.sock alone", ents)
	}
	// The agent's socket serves no approval endpoint.
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return new(net.Dialer).DialContext(ctx, "unix", filepath.Join(f.agentDir, ask.AgentSocketName))
	}}}
	for _, r := range []struct{ method, path string }{{"GET", "/v1/requests"}, {"GET", "/v1/watch"}, {"POST", "/v1/requests/a1"}} {
		req, _ := http.NewRequest(r.method, "http://sandbox"+r.path, bytes.NewReader([]byte(`{"action":"allow","scope":"once"}`)))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			t.Errorf("%s %s on request.sock: %s", r.method, r.path, resp.Status)
		}
	}
}

func TestResizerBounds(t *testing.T) {
	z := NewResizer(backend.Resources{CPUs: 1, Memory: 1 << 30, PIDs: 100}, backend.Resources{CPUs: 4, Memory: 8 << 30, PIDs: 1000},
		func(context.Context, backend.Resources) error { return errors.New("engine says no") })
	req := ask.Request{Kind: "resources", Resources: &ask.ResourcesAsk{CPUs: 3}}
	if err := z.Check(req); err != nil {
		t.Fatal(err)
	}
	if _, err := z.Handle(context.Background(), req); err == nil || z.Current().CPUs != 1 {
		t.Errorf("a failed update: err %v, limits %+v", err, z.Current())
	}
	for _, r := range []ask.ResourcesAsk{{CPUs: 0.5}, {CPUs: 5}, {PIDs: 1001}, {Memory: 9 << 30}, {CPUs: 1}} {
		if err := z.Check(ask.Request{Kind: "resources", Resources: &r}); err == nil {
			t.Errorf("%+v passed", r)
		}
	}
}

// A request's resolver says what it comes to before anyone is asked: the
// approver is shown that, the handler carries out that, and the log
// records it; what the agent wrote in its place is dropped.
func TestAgentRequestResolved(t *testing.T) {
	f := newAgentFixture(t, "mount")
	handled := make(chan ask.Request, 1)
	f.srv.Handlers.Register(ask.KindMount, func(_ context.Context, req ask.Request) (map[string]any, error) {
		handled <- req
		return map[string]any{"path": "/run/propio-sandbox/mounts/data"}, nil
	})
	f.srv.Handlers.Resolve(ask.KindMount, func(req ask.Request) (ask.Request, error) {
		if req.Mount.Resolved != "" {
			return req, errors.New("the agent's resolved path reached the resolver")
		}
		mo := *req.Mount
		mo.Resolved = "/srv/data"
		req.Mount = &mo
		return req, nil
	})
	shown := make(chan ask.Request, 1)
	f.approve(t, func(r ask.Request) ask.Decision {
		shown <- r
		return ask.Decision{Action: ask.Allow, Scope: ask.ScopeOnce}
	})
	a := f.post(t, `{"kind":"mount","mount":{"source":"~/data","resolved":"/elsewhere"},"reason":"fixtures"}`)
	if a.Decision != ask.Allow || a.Error != "" {
		t.Fatalf("answer %+v", a)
	}
	const want = "~/data → /srv/data"
	if r := <-shown; r.What() != want {
		t.Errorf("the approver was shown %q, want %q", r.What(), want)
	}
	if r := <-handled; r.Mount.Resolved != "/srv/data" {
		t.Errorf("the handler got %+v", r.Mount)
	}
	entries, err := decisionlog.Read(f.logPath)
	if err != nil || len(entries) != 1 || entries[0].Asked != want {
		t.Fatalf("log %v %+v; want it to have asked %q", err, entries, want)
	}
}
