package ask

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/termsafe"
)

// Two brokers in one ask directory, the gateway's (ask.sock) and the
// launcher's (launcher.sock, started later): the client lists, watches and
// decides the requests of both, whose IDs never meet; an agent's requests
// are never merged.
func TestClientCoversEverySocket(t *testing.T) {
	gw := &Broker{Project: "p", Workspace: "/w", Timeout: time.Minute}
	s := serve(t, gw)
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan Event, 64)
	attached := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.WatchAttached(ctx, func() { close(attached) }, func(ev Event) { events <- ev })
	}()
	t.Cleanup(func() { cancel(); <-done })
	<-attached

	// The launcher's socket appears while the watch runs.
	la := &Broker{Project: "p", Workspace: "/w", Timeout: time.Minute, Prefix: "a"}
	l, err := net.Listen("unix", filepath.Join(s.Dir, LauncherSocketName))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: la.Handler()}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	for !la.Attached() {
		time.Sleep(time.Millisecond)
	}

	outcomes := make(chan Outcome, 3)
	go func() { outcomes <- gw.Ask(ctx, Request{Host: "a.test", Port: 443, Via: "connect"}) }()
	<-events
	ask := Request{Kind: KindResources, Via: "agent", Reason: "build", Resources: &ResourcesAsk{PIDs: 500}}
	for range 2 {
		go func() { outcomes <- la.Ask(ctx, ask) }()
		<-events
	}
	reqs, err := s.Pending(ctx)
	if err != nil || len(reqs) != 3 {
		t.Fatalf("pending = %+v, %v; want the gateway's and the agent's two", reqs, err)
	}
	ids := map[string]bool{}
	for _, r := range reqs {
		ids[r.ID] = true
		if err := s.Decide(ctx, r.ID, Decision{Allow, ScopeOnce}); err != nil {
			t.Fatalf("deciding %s: %v", r.ID, err)
		}
	}
	if !ids["1"] || !ids["a1"] || !ids["a2"] {
		t.Fatalf("IDs %v, want 1, a1 and a2", ids)
	}
	for range 3 {
		if o := <-outcomes; o.Action != Allow || o.DecidedBy != ByUser {
			t.Fatalf("outcome %+v", o)
		}
	}
	if got := reqs[1].What(); got != "pids 500" {
		t.Errorf("What() = %q", got)
	}
}

func TestParseAgentAsk(t *testing.T) {
	for body, ok := range map[string]bool{
		`{"kind":"port","port":3000,"reason":"preview"}`:                       true,
		`{"kind":"port","port":0,"reason":"preview"}`:                          false,
		`{"kind":"resources","resources":{"cpus":2},"reason":"x"}`:             true,
		`{"kind":"resources","resources":{},"reason":"x"}`:                     false,
		`{"kind":"resources","resources":{"memory":-1,"pids":5},"reason":"x"}`: false,
		`{"kind":"mount","mount":{"source":"/data"},"reason":"x"}`:             true,
		`{"kind":"mount","mount":{"source":"data"},"reason":"x"}`:              false,
		`{"kind":"mount","mount":{"source":"~/data"},"reason":"x"}`:            true,
		`{"kind":"network","reason":"x"}`:                                      false,
		`{"kind":"port","port":3000}`:                                          false,
		`not json`:                                                             false,
	} {
		if _, err := ParseAgentAsk([]byte(body)); (err == nil) != ok {
			t.Errorf("%s: %v", body, err)
		}
	}
}

// A reason or a mount's target that holds a character a terminal acts on
// is refused, with the field named; JSON carries every one of them. A
// mount's source is a host path, taken as it is (and shown inert).
func TestParseAgentAskRefusesControls(t *testing.T) {
	for _, r := range termsafe.Controls() {
		c := string(r)
		for field, a := range map[string]AgentAsk{
			"reason":       {Kind: KindPort, Port: 3000, Reason: "preview" + c},
			"mount.target": {Kind: KindMount, Reason: "x", Mount: &MountAsk{Source: "/data", Target: "/mnt/" + c + "x"}},
		} {
			body, err := json.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ParseAgentAsk(body)
			if err == nil || !strings.Contains(err.Error(), field+" holds") {
				t.Errorf("%s with %U: %v, want it refused", field, r, err)
			}
		}
		body, _ := json.Marshal(AgentAsk{Kind: KindMount, Reason: "x", Mount: &MountAsk{Source: "/data" + c}})
		if _, err := ParseAgentAsk(body); err != nil {
			t.Errorf("source with %U: %v", r, err)
		}
	}
}

// A mount request is shown by the path the launcher copies, beside the one
// the agent asked for when they differ; before it is judged, by the latter.
func TestMountWhat(t *testing.T) {
	for want, m := range map[string]MountAsk{
		"/data":                             {Source: "/data"},
		"/data at d, write":                 {Source: "/data", Resolved: "/data", Target: "d", Write: true},
		"~/data → /home/me/data":            {Source: "~/data", Resolved: "/home/me/data"},
		"/ws/fixtures → /srv/fixtures at f": {Source: "/ws/fixtures", Resolved: "/srv/fixtures", Target: "f"},
	} {
		if got := (Request{Kind: KindMount, Mount: &m}).What(); got != want {
			t.Errorf("What() = %q, want %q", got, want)
		}
	}
}
