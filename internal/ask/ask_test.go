package ask

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// serve runs b on a socket in a fresh ask directory under XDG_RUNTIME_DIR.
func serve(t *testing.T, b *Broker) Sandbox {
	t.Helper()
	runtimeDir(t)
	base, err := BaseDir()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := Make(base, b.Project, b.Workspace)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("ask directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, SocketName))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: b.Handler()}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	found, err := Find(b.Workspace, false)
	if err != nil || len(found) != 1 || found[0].Project != b.Project {
		t.Fatalf("Find = %v, %v; want the sandbox %s", found, err, b.Project)
	}
	if other, _ := Find("/elsewhere", false); len(other) != 0 {
		t.Fatalf("Find of another workspace = %v", other)
	}
	return found[0]
}

// watch attaches an approver and returns its events, once it is attached.
func watch(t *testing.T, s Sandbox, b *Broker) <-chan Event {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan Event, 64)
	done := make(chan struct{})
	go func() { defer close(done); s.Watch(ctx, func(ev Event) { events <- ev }) }()
	t.Cleanup(func() { cancel(); <-done })
	for !b.Attached() {
		time.Sleep(time.Millisecond)
	}
	return events
}

// A socket whose path is too long for a socket address is reached all the
// same.
func TestLongSocketPath(t *testing.T) {
	b := &Broker{Project: "p", Workspace: "/w", Timeout: time.Minute}
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The gateway listens by a short path of its own (its mount).
	wd, _ := os.Getwd()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", SocketName)
	os.Chdir(wd)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: b.Handler()}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	s := Sandbox{Project: "p", Workspace: "/w", Dir: dir}
	if reqs, err := s.Pending(context.Background()); err != nil || len(reqs) != 0 {
		t.Fatalf("Pending through %d bytes of path: %v, %v", len(filepath.Join(dir, SocketName)), reqs, err)
	}
}

func TestNoApproverDeniesAtOnce(t *testing.T) {
	b := &Broker{Project: "p", Workspace: "/w", Timeout: time.Minute}
	start := time.Now()
	o := b.Ask(context.Background(), Request{Host: "a.test", Port: 443})
	if o.Action != Deny || o.DecidedBy != ByNoApprover || time.Since(start) > time.Second {
		t.Fatalf("Ask without an approver = %+v after %v", o, time.Since(start))
	}
}

func TestAskDecideMerge(t *testing.T) {
	b := &Broker{Project: "p", Workspace: "/w", Timeout: time.Minute}
	s := serve(t, b)
	events := watch(t, s, b)

	var wg sync.WaitGroup
	outcomes := make([]Outcome, 2)
	for i := range outcomes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outcomes[i] = b.Ask(context.Background(), Request{Host: "a.test", Port: 443, Via: "connect"})
		}()
	}
	ev := <-events
	if ev.Type != EventPending || ev.Request.Host != "a.test" || ev.Request.Project != "p" || ev.Request.Kind != KindNetwork {
		t.Fatalf("first event = %+v", ev)
	}
	// The second Ask joins the first: there is nothing to await for it
	// (joining sends no event), so it is given a moment.
	time.Sleep(20 * time.Millisecond)
	reqs, err := s.Pending(context.Background())
	if err != nil || len(reqs) != 1 {
		t.Fatalf("pending = %+v, %v; want one merged request", reqs, err)
	}
	if err := s.Decide(context.Background(), ev.Request.ID, Decision{Allow, ScopeRun}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, o := range outcomes {
		if o.Action != Allow || o.Scope != ScopeRun || o.DecidedBy != ByUser {
			t.Fatalf("outcome = %+v", o)
		}
	}
	if ev := <-events; ev.Type != EventDecided || ev.DecidedBy != ByUser || ev.Decision.Action != Allow {
		t.Fatalf("second event = %+v", ev)
	}
	if err := s.Decide(context.Background(), ev.Request.ID, Decision{Deny, ScopeOnce}); !errors.Is(err, ErrGone) {
		t.Fatalf("deciding again: %v; want ErrGone", err)
	}
}

func TestTimeoutAndCap(t *testing.T) {
	b := &Broker{Project: "p", Workspace: "/w", Timeout: 50 * time.Millisecond, Cap: 1}
	s := serve(t, b)
	events := watch(t, s, b)
	done := make(chan Outcome)
	go func() { done <- b.Ask(context.Background(), Request{Host: "a.test", Port: 443}) }()
	<-events
	if o := b.Ask(context.Background(), Request{Host: "b.test", Port: 443}); o.Action != Deny || o.DecidedBy != ByNoApprover || o.Why == "" {
		t.Fatalf("over the cap: %+v", o)
	}
	if o := <-done; o.Action != Deny || o.DecidedBy != ByTimeout {
		t.Fatalf("after the timeout: %+v", o)
	}
}
