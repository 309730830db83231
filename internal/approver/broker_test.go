package approver

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
)

// TestBoardOverBroker: the board, through ask's client, as the approver of
// a real ask.Broker (the gateway's side) on its socket: a held connection
// shows, the board's decision releases it, and a timeout shows as such.
func TestBoardOverBroker(t *testing.T) {
	rt, err := os.MkdirTemp("", "ask") // short: a unix socket path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rt) })
	t.Setenv("XDG_RUNTIME_DIR", rt)
	br := &ask.Broker{Project: "ws-1", Workspace: "/ws", Timeout: time.Minute}
	base, err := ask.BaseDir()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := ask.Make(base, br.Project, br.Workspace)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, ask.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: br.Handler()}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	b := NewBoard(func() ([]Target, error) {
		sbs, err := Find("/ws", false)
		return Targets(sbs), err
	}, nil, 20*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitBoard(t, b, "the sandbox", func(s Snapshot) bool { return len(s.Sandboxes) == 1 })
	for deadline := time.Now().Add(10 * time.Second); !br.Attached(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) { // the broker tells no one when a watch attaches
			t.Fatal("the board's watch did not attach within 10s")
		}
	}

	outcome := make(chan ask.Outcome)
	go func() {
		outcome <- br.Ask(context.Background(), Request{Host: "api.example.test", Port: 443, Via: "connect", Reason: "no network.allow rule matches"})
	}()
	s := waitBoard(t, b, "the held connection", func(s Snapshot) bool { return len(s.Pending) == 1 })
	r := s.Pending[0].Request
	if r.Host != "api.example.test" || r.Project != "ws-1" || r.Workspace != "/ws" {
		t.Fatalf("pending %+v", r)
	}
	if err := b.Decide(context.Background(), "ws-1", r.ID, Decision{Action: Allow, Scope: Run}); err != nil {
		t.Fatal(err)
	}
	if o := <-outcome; o.Decision != (Decision{Action: Allow, Scope: Run}) || o.DecidedBy != ask.ByUser {
		t.Fatalf("outcome %+v", o)
	}
	s = waitBoard(t, b, "decided", func(s Snapshot) bool { return len(s.Pending) == 0 && len(s.Decided) == 1 })
	if s.Decided[0].DecidedBy != ask.ByUser {
		t.Fatalf("decided %+v", s.Decided[0])
	}

	// Nobody decides: the gateway's timeout does, and the board says so.
	br.Timeout = 50 * time.Millisecond
	go func() {
		outcome <- br.Ask(context.Background(), Request{Host: "cdn.example.test", Port: 443, Via: "http"})
	}()
	if o := <-outcome; o.DecidedBy != ask.ByTimeout {
		t.Fatalf("outcome %+v", o)
	}
	s = waitBoard(t, b, "timed out", func(s Snapshot) bool { return len(s.Pending) == 0 && len(s.Decided) == 2 })
	if d := s.Decided[0]; d.DecidedBy != ask.ByTimeout || d.Request.Host != "cdn.example.test" || d.Decision.Action != Deny {
		t.Fatalf("decided %+v", d)
	}
}
