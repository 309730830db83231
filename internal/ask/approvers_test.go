package ask

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/fsutil"
)

// Approvers from a sandbox's first instant: a registered approver is
// announced each sandbox of its workspace before it starts and holds it; a
// broker holds a request for an approver that holds its sandbox, until it
// attaches, and denies it once none does.

// runtimeDir points XDG_RUNTIME_DIR at a fresh, short directory.
func runtimeDir(t *testing.T) string {
	t.Helper()
	rt, err := os.MkdirTemp("", "ask") // short: a unix socket path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rt) })
	t.Setenv("XDG_RUNTIME_DIR", rt)
	return rt
}

// makeSandbox makes the ask directory of project of workspace.
func makeSandbox(t *testing.T, project, workspace string) Sandbox {
	t.Helper()
	base, err := BaseDir()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := Make(base, project, workspace)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestHold(t *testing.T) {
	runtimeDir(t)
	s := makeSandbox(t, "p", "/w")
	if Held(s.Dir) {
		t.Fatal("held before any approver")
	}
	release, err := s.Hold()
	if err != nil {
		t.Fatal(err)
	}
	if !Held(s.Dir) {
		t.Fatal("not held while an approver holds it")
	}
	release()
	if Held(s.Dir) {
		t.Fatal("held after the approver let go")
	}
	// A hold its approver left behind (killed) holds nothing.
	if err := os.WriteFile(filepath.Join(s.Dir, "approver-dead"+holdSuffix), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if Held(s.Dir) {
		t.Fatal("held by a hold without a lock")
	}
}

// takes records what an approver takes up.
type takes struct {
	ch chan Sandbox
}

func (tk takes) take(ctx context.Context, s Sandbox) {
	tk.ch <- s
	<-ctx.Done()
	tk.ch <- Sandbox{} // the launcher hung up
}

func register(t *testing.T, workspace string, all bool) takes {
	t.Helper()
	reg, err := Register(workspace, all)
	if err != nil {
		t.Fatal(err)
	}
	tk := takes{ch: make(chan Sandbox, 4)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); reg.Serve(ctx, tk.take) }()
	t.Cleanup(func() { cancel(); reg.Close(); <-done })
	return tk
}

func TestAnnounce(t *testing.T) {
	runtimeDir(t)
	mine, all, other := register(t, "/w", false), register(t, "", true), register(t, "/elsewhere", false)
	// The registration of an approver that was killed: no one listens.
	dir, _ := ApproversDir()
	stale := filepath.Join(approversOf(dir, "/w", false), "dead.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	s := makeSandbox(t, "p", "/w")
	held, hangup := Announce(s)
	if held != 2 {
		t.Fatalf("held by %d approvers, want 2 (the workspace's and the one of all)", held)
	}
	for _, tk := range []takes{mine, all} {
		if got := <-tk.ch; got.Project != "p" || got.Dir != s.Dir {
			t.Fatalf("took up %+v", got)
		}
	}
	if !Held(s.Dir) {
		t.Fatal("announced, and not held")
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the registration of a gone approver is still there: %v", err)
	}
	hangup()
	for _, tk := range []takes{mine, all} {
		if got := <-tk.ch; got.Project != "" {
			t.Fatalf("after the hangup: %+v", got)
		}
	}
	for Held(s.Dir) { // each lets go as it sees the hangup
		time.Sleep(time.Millisecond)
	}
	select {
	case got := <-other.ch:
		t.Fatalf("the approver of another workspace took up %+v", got)
	default:
	}
}

// An approver refuses what is not an ask directory of its workspace.
func TestAnnounceRefused(t *testing.T) {
	runtimeDir(t)
	reg, err := Register("/w", false)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	for _, dir := range []string{"/etc", t.TempDir(), makeSandbox(t, "q", "/other").Dir} {
		if _, err := reg.announced(dir); err == nil {
			t.Errorf("announced %s: taken up", dir)
		}
	}
}

// onItsWay is a broker's Expect, true until set: an approver on its way.
type onItsWay chan bool

func newOnItsWay() onItsWay {
	w := make(onItsWay, 1)
	w <- true
	return w
}

func (w onItsWay) expect() bool { v := <-w; w <- v; return v }

func (w onItsWay) set(v bool) { <-w; w <- v }

func TestBrokerAwaitsAnApproverOnItsWay(t *testing.T) {
	b := &Broker{Project: "p", Workspace: "/w", Timeout: time.Minute, Expect: newOnItsWay().expect}
	s := serve(t, b)

	// Nothing attached, an approver on its way: the request waits, and the
	// approver finds it pending when it attaches.
	done := pendingAsk(b)
	events := watch(t, s, b)
	decideFirst(t, s, events, done, Allow)
}

func TestBrokerApproverGoneBeforeAttaching(t *testing.T) {
	way := newOnItsWay()
	b := &Broker{Project: "p", Workspace: "/w", Timeout: time.Hour, Expect: way.expect}
	done := pendingAsk(b)
	way.set(false) // the approver went before it attached
	if o := <-done; o.Action != Deny || o.DecidedBy != ByNoApprover || o.Why == "" {
		t.Fatalf("outcome %+v, want denied for want of an approver", o)
	}
	// Without one on its way, at once.
	if o := b.Ask(context.Background(), Request{Host: "b.test", Port: 443}); o.DecidedBy != ByNoApprover {
		t.Fatalf("outcome %+v", o)
	}
}

// TestFollowFromFirstInstant: an approver that follows a workspace, and
// looks for nothing after it starts, is announced a sandbox before its
// server even listens; the server's first request waits for it, and the
// approver is shown it and decides it.
func TestFollowFromFirstInstant(t *testing.T) {
	runtimeDir(t)
	reg, err := Register("/w", false)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ctx, cancel := context.WithCancel(context.Background())
	events, ready, ended := make(chan Event, 16), make(chan struct{}), make(chan error)
	go func() {
		ended <- Follow(ctx, "/w", false, reg, time.Hour, func() { close(ready) }, func(ev Event) { events <- ev })
	}()
	defer func() { cancel(); <-ended }()
	<-ready

	s := makeSandbox(t, "p", "/w")
	held, hangup := Announce(s)
	defer hangup()
	if held != 1 {
		t.Fatalf("held by %d approvers, want 1", held)
	}
	b := &Broker{Project: "p", Workspace: "/w", Timeout: time.Minute, Expect: func() bool { return Held(s.Dir) }}
	done := pendingAsk(b) // before it listens
	l, err := fsutil.ListenUnix(s.Dir, SocketName, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: b.Handler()}
	go srv.Serve(l)
	defer srv.Close()
	decideFirst(t, s, events, done, Deny)
}

// pendingAsk asks b for a.test:443 in the background, and returns once
// the request is pending; its outcome comes on the channel.
func pendingAsk(b *Broker) <-chan Outcome {
	done := make(chan Outcome, 1)
	go func() { done <- b.Ask(context.Background(), Request{Host: "a.test", Port: 443}) }()
	for len(b.Pending()) == 0 {
		time.Sleep(time.Millisecond)
	}
	return done
}

// decideFirst decides the first event, a.test pending, with action, as
// the user, and checks the outcome.
func decideFirst(t *testing.T, s Sandbox, events <-chan Event, done <-chan Outcome, action string) {
	t.Helper()
	ev := <-events
	if ev.Type != EventPending || ev.Request.Host != "a.test" {
		t.Fatalf("first event %+v", ev)
	}
	if err := s.Decide(context.Background(), ev.Request.ID, Decision{action, ScopeOnce}); err != nil {
		t.Fatal(err)
	}
	if o := <-done; o.Action != action || o.DecidedBy != ByUser {
		t.Fatalf("outcome %+v, want %s by the user", o, action)
	}
}
