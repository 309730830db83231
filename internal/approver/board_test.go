package approver

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeAsker is a sandbox that asks: its watch sends the pending requests,
// then what push sends; Decide records decisions and, as a gateway does,
// sends the decided event.
type fakeAsker struct {
	project string

	mu        sync.Mutex
	pending   []Request
	decisions map[string]Decision
	watchers  []chan Event
	watching  chan struct{} // closed when a watch is attached
	once      sync.Once
}

func newFake(project string, pending ...Request) *fakeAsker {
	for i := range pending {
		pending[i].Project = project
	}
	return &fakeAsker{project: project, pending: pending, decisions: map[string]Decision{}, watching: make(chan struct{})}
}

func (f *fakeAsker) Pending(context.Context) ([]Request, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.pending), nil
}

func (f *fakeAsker) Watch(ctx context.Context, fn func(Event)) error {
	ch := make(chan Event, 16)
	f.mu.Lock()
	for _, r := range f.pending {
		ch <- Event{Type: "pending", Request: r}
	}
	f.watchers = append(f.watchers, ch)
	f.mu.Unlock()
	f.once.Do(func() { close(f.watching) })
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-ch:
			if !ok {
				return errors.New("the gateway went away") // as ask.Sandbox's Watch says it
			}
			fn(e)
		}
	}
}

func (f *fakeAsker) push(e Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e.Request.Project = f.project
	if e.Type == "pending" {
		f.pending = append(f.pending, e.Request)
	}
	for _, w := range f.watchers {
		w <- e
	}
}

// end ends the sandbox: its watches return.
func (f *fakeAsker) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.watchers {
		close(w)
	}
	f.watchers = nil
}

func (f *fakeAsker) Decide(_ context.Context, id string, d Decision) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.pending, func(r Request) bool { return r.ID == id })
	if i < 0 {
		return ErrGone
	}
	r := f.pending[i]
	f.pending = slices.Delete(f.pending, i, i+1)
	f.decisions[id] = d
	for _, w := range f.watchers {
		w <- Event{Type: "decided", Request: r, Decision: &d, DecidedBy: "user"}
	}
	return nil
}

func (f *fakeAsker) decision(id string) (Decision, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.decisions[id]
	return d, ok
}

func req(id, host string, port int) Request {
	return Request{ID: id, Kind: "network", Host: host, Port: port, Via: "connect", Workspace: "/ws",
		Reason: "no network.allow rule matches", Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).Add(time.Duration(len(id)) * time.Second)}
}

// startBoard runs a board over the fakes until the test ends.
func startBoard(t *testing.T, grant Granter, fakes ...*fakeAsker) *Board {
	t.Helper()
	var mu sync.Mutex
	b := NewBoard(func() ([]Target, error) {
		mu.Lock()
		defer mu.Unlock()
		var out []Target
		for _, f := range fakes {
			out = append(out, Target{Project: f.project, Workspace: "/ws", Asker: f})
		}
		return out, nil
	}, grant, 20*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return b
}

// waitBoard waits, by the board's change notifications, until cond holds.
func waitBoard(t *testing.T, b *Board, what string, cond func(Snapshot) bool) Snapshot {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s, changed := b.Snapshot()
		if cond(s) {
			return s
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %s within 10s; board: %+v", what, s)
		}
	}
}

func TestBoardPendingAndDecide(t *testing.T) {
	t.Parallel()
	f := newFake("ws-1", req("r1", "api.example.test", 443))
	b := startBoard(t, nil, f)
	s := waitBoard(t, b, "pending request", func(s Snapshot) bool { return len(s.Pending) == 1 })
	if s.Always || len(s.Sandboxes) != 1 || s.Sandboxes[0].Project != "ws-1" {
		t.Fatalf("snapshot: %+v", s)
	}
	f.push(Event{Type: "pending", Request: req("r22", "pkg.example.test", 80)})
	waitBoard(t, b, "second request", func(s Snapshot) bool { return len(s.Pending) == 2 })

	if err := b.Decide(context.Background(), "ws-1", "r1", Decision{Action: Allow, Scope: Run}); err != nil {
		t.Fatal(err)
	}
	if d, ok := f.decision("r1"); !ok || d != (Decision{Action: Allow, Scope: Run}) {
		t.Fatalf("the sandbox got %+v %v", d, ok)
	}
	s = waitBoard(t, b, "decided", func(s Snapshot) bool { return len(s.Pending) == 1 && len(s.Decided) == 1 })
	if d := s.Decided[0]; d.Request.ID != "r1" || d.DecidedBy != "user" || *d.Decision != (Decision{Action: Allow, Scope: Run}) {
		t.Fatalf("decided: %+v", d)
	}
	// A request decided elsewhere (or gone) is ErrGone, and leaves the board.
	if err := b.Decide(context.Background(), "ws-1", "r1", Decision{Action: Deny, Scope: Once}); !errors.Is(err, ErrGone) {
		t.Fatalf("deciding twice: %v", err)
	}
	// A timeout decided by the gateway shows with its decided_by.
	f.mu.Lock()
	f.pending = nil
	f.mu.Unlock()
	f.push(Event{Type: "decided", Request: req("r22", "pkg.example.test", 80), Decision: &Decision{Action: Deny, Scope: Once}, DecidedBy: "timeout"})
	s = waitBoard(t, b, "timeout", func(s Snapshot) bool { return len(s.Pending) == 0 && len(s.Decided) == 2 })
	if s.Decided[0].DecidedBy != "timeout" {
		t.Fatalf("newest decided first: %+v", s.Decided)
	}
}

func TestBoardBadDecision(t *testing.T) {
	t.Parallel()
	f := newFake("ws-1", req("r1", "a.test", 443))
	b := startBoard(t, nil, f)
	waitBoard(t, b, "pending", func(s Snapshot) bool { return len(s.Pending) == 1 })
	for name, d := range map[string]Decision{"action": {Action: "maybe", Scope: Once}, "scope": {Action: Allow, Scope: "forever"}} {
		if err := b.Decide(context.Background(), "ws-1", "r1", d); err == nil {
			t.Errorf("%s: a bad decision was taken", name)
		}
	}
	if err := b.Decide(context.Background(), "ws-1", "r1", Decision{Action: Allow, Scope: Always}); !errors.Is(err, ErrNoGrants) {
		t.Errorf("always without a granter: %v", err)
	}
	if _, ok := f.decision("r1"); ok {
		t.Error("a refused decision reached the sandbox")
	}
}

func TestBoardAlwaysGrantsFirst(t *testing.T) {
	t.Parallel()
	f := newFake("ws-1", req("r1", "a.test", 8443))
	var got []string
	fail := false
	grant := func(ws, host string, port int, action string) error {
		if fail {
			return errors.New("disk full")
		}
		if _, decided := f.decision("r1"); decided {
			t.Error("the decision was posted before the grant was saved")
		}
		got = append(got, ws, host, Dest("", port), action)
		return nil
	}
	b := startBoard(t, grant, f)
	s := waitBoard(t, b, "pending", func(s Snapshot) bool { return len(s.Pending) == 1 })
	if !s.Always {
		t.Fatal("always is not offered with a granter")
	}
	fail = true
	if err := b.Decide(context.Background(), "ws-1", "r1", Decision{Action: Deny, Scope: Always}); err == nil {
		t.Fatal("a grant that failed to save still decided")
	}
	if _, ok := f.decision("r1"); ok {
		t.Fatal("decided although the grant was not saved")
	}
	fail = false
	if err := b.Decide(context.Background(), "ws-1", "r1", Decision{Action: Deny, Scope: Always}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"/ws", "a.test", ":8443", "deny"}; !slices.Equal(got, want) {
		t.Fatalf("grant %q, want %q", got, want)
	}
}

// TestBoardSandboxEnds: a sandbox that ends leaves the board with its
// requests; one that starts later is attached by the rescan.
func TestBoardSandboxEnds(t *testing.T) {
	t.Parallel()
	f := newFake("ws-1", req("r1", "a.test", 443))
	var mu sync.Mutex
	fakes := []*fakeAsker{f}
	b := NewBoard(func() ([]Target, error) {
		mu.Lock()
		defer mu.Unlock()
		var out []Target
		for _, f := range fakes {
			out = append(out, Target{Project: f.project, Workspace: "/ws", Asker: f})
		}
		return out, nil
	}, nil, 10*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitBoard(t, b, "pending", func(s Snapshot) bool { return len(s.Pending) == 1 })
	mu.Lock()
	fakes = nil
	mu.Unlock()
	f.end()
	// Its watch's end is no error once it is gone.
	waitBoard(t, b, "the sandbox gone", func(s Snapshot) bool { return len(s.Pending) == 0 && len(s.Sandboxes) == 0 && s.Error == "" })
	g := newFake("ws-2", req("q1", "b.test", 443))
	mu.Lock()
	fakes = []*fakeAsker{g}
	mu.Unlock()
	s := waitBoard(t, b, "the new sandbox", func(s Snapshot) bool { return len(s.Pending) == 1 })
	if s.Pending[0].Request.Project != "ws-2" {
		t.Fatalf("pending: %+v", s.Pending)
	}
}
