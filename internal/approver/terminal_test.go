package approver

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/termsafe"
)

func TestParseKeys(t *testing.T) {
	t.Parallel()
	got := parseKeys([]byte("a\x1b[A\x1b[Br\x1bOBD\x03"))
	want := []string{"a", KeyUp, KeyDown, "r", KeyDown, "D", KeyQuit}
	if !slices.Equal(got, want) {
		t.Fatalf("keys %q, want %q", got, want)
	}
}

func TestScreen(t *testing.T) {
	t.Parallel()
	snap := Snapshot{
		Sandboxes: []SandboxInfo{{"ws-1", "/ws"}},
		Pending:   []Item{{Request: req("r1", "a.test", 443)}, {Request: req("r22", "b.test", 80)}},
	}
	for i := range snap.Pending {
		snap.Pending[i].Request.Project = "ws-1"
	}
	var s Screen
	s.Width = 60
	s.Update(snap)
	view := strings.Join(s.View(), "\n")
	if !strings.Contains(view, "> a.test:443") || !strings.Contains(view, "  b.test:80") {
		t.Fatalf("the first request is not selected:\n%s", view)
	}
	if strings.Contains(view, "allow always") {
		t.Fatalf("always offered without a granter:\n%s", view)
	}
	for _, l := range s.View() {
		if len([]rune(l)) > 60 {
			t.Errorf("line wider than the terminal: %q", l)
		}
	}
	if _, d, _ := s.Key("A"); d != nil || !strings.Contains(s.msg, "always") {
		t.Fatalf("always without a granter: %v %q", d, s.msg)
	}
	s.Key(KeyDown)
	it, d, quit := s.Key("x")
	if quit || it == nil || it.Request.ID != "r22" || *d != (Decision{Action: Deny, Scope: Run}) {
		t.Fatalf("x on the second: %+v %+v %v", it, d, quit)
	}
	// The selection stays on its request when one before it is decided.
	snap.Pending = snap.Pending[1:]
	s.Update(snap)
	if it, _, _ := s.Key("a"); it.Request.ID != "r22" {
		t.Fatalf("selection moved to %s", it.Request.ID)
	}
	if _, _, quit := s.Key("q"); !quit {
		t.Fatal("q does not quit")
	}
}

// TestTerminal runs the terminal UI over pipes against a fake sandbox: keys
// in, the screen out, the decision reaches the sandbox.
func TestTerminal(t *testing.T) {
	t.Parallel()
	f := newFake("ws-1", req("r1", "a.test", 443))
	b := startBoard(t, nil, f)
	waitBoard(t, b, "pending", func(s Snapshot) bool { return len(s.Pending) == 1 })
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error)
	go func() {
		done <- Terminal(context.Background(), b, inR, outW, func() (int, int) { return 100, 30 }, nil)
		outW.Close()
	}()
	screen := make(chan string, 100)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := outR.Read(buf)
			screen <- string(buf[:n])
			if err != nil {
				close(screen)
				return
			}
		}
	}()
	await := func(s string) {
		t.Helper()
		var all strings.Builder
		for chunk := range screen {
			all.WriteString(chunk)
			if strings.Contains(all.String(), s) {
				return
			}
		}
		t.Fatalf("the screen never showed %q:\n%q", s, all.String())
	}
	await("> a.test:443")
	io.WriteString(inW, "r")
	await("allow a.test:443: run")
	if d, _ := f.decision("r1"); d != (Decision{Action: Allow, Scope: Run}) {
		t.Fatalf("decision %+v", d)
	}
	io.WriteString(inW, "q")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	await("\x1b[?1049l") // the terminal's own screen is back
}

// TestScreenInFlightKey: when the selected request goes without the user's
// decision (its timeout), the selection moves to the next, and a key read
// within Settle of the move decides nothing; after Settle, or once the
// user selects, it decides the request selected, by its id. A move after
// the user's own decision is the user's.
func TestScreenInFlightKey(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := Screen{Now: func() time.Time { return now }}
	r1, r2, r3 := Item{Request: req("r1", "a.test", 443)}, Item{Request: req("r22", "b.test", 443)}, Item{Request: req("r333", "c.test", 443)}
	s.Update(Snapshot{Pending: []Item{r1, r2, r3}})
	if it, _, _ := s.Key("a"); it == nil || it.Request.ID != "r1" {
		t.Fatalf("a on the first: %+v", it)
	}
	// r1 times out as the key is pressed.
	s.Update(Snapshot{Pending: []Item{r2, r3}})
	if it, d, _ := s.Key("a"); it != nil || d != nil || !strings.Contains(s.msg, "not decided") || !strings.Contains(s.msg, "b.test:443") {
		t.Fatalf("a key just after the move: %+v %+v %q, want nothing decided", it, d, s.msg)
	}
	now = now.Add(Settle - time.Millisecond)
	if it, _, _ := s.Key("d"); it != nil {
		t.Fatalf("a key within Settle of the move decided %s", it.Request.ID)
	}
	now = now.Add(time.Millisecond)
	if it, d, _ := s.Key("d"); it == nil || it.Request.ID != "r22" || *d != (Decision{Action: Deny, Scope: Once}) {
		t.Fatalf("d after Settle: %+v %+v", it, d)
	}
	// The list empties under the selection, and a request comes: still
	// nothing within Settle.
	s.Update(Snapshot{})
	s.Update(Snapshot{Pending: []Item{r3}})
	if it, _, _ := s.Key("a"); it != nil {
		t.Fatalf("a key just after the list changed decided %s", it.Request.ID)
	}
	// The user's own decision moves the selection on: no wait.
	now = now.Add(Settle)
	it, _, _ := s.Key("a")
	if it == nil || it.Request.ID != "r333" {
		t.Fatalf("a on r333: %+v", it)
	}
	s.Decided(*it)
	s.Update(Snapshot{Pending: []Item{r1, r2}})
	if it, _, _ := s.Key("a"); it == nil || it.Request.ID != "r1" {
		t.Fatalf("a after the user's own decision: %+v", it)
	}
	// Selecting is the user's doing too.
	s.Update(Snapshot{Pending: []Item{r2}}) // r1 went by timeout
	s.Update(Snapshot{Pending: []Item{r2, r3}})
	s.Key(KeyDown)
	if it, _, _ := s.Key("a"); it == nil || it.Request.ID != "r333" {
		t.Fatalf("a after the user selected: %+v", it)
	}
}

// TestScreenInert: what a sandbox sends (a name, a reason, a mount's
// target, every control, C1 and bidi character in them) reaches the
// screen escaped, and a long destination is cut from the left, never
// losing the end that says where it goes.
func TestScreenInert(t *testing.T) {
	t.Parallel()
	all := string(termsafe.Controls()) + "\x9b\xff" // and C1 raw, a byte that is not UTF-8
	long := req("r1", "api.anthropic.com."+strings.Repeat("x", 120)+".evil.test", 443)
	long.Reason = "\x1b[2JAll clear, nothing pending" + all
	mount := req("r2", "", 0)
	mount.Kind, mount.Via = "mount", "agent"
	mount.Mount = &ask.MountAsk{Source: "/home/u/ws/" + strings.Repeat("data/", 30) + "etc/ssh", Target: "/mnt/\x1b]0;pwned\x07" + all}
	snap := Snapshot{Sandboxes: []SandboxInfo{{"ws-1", "/ws"}}, Pending: []Item{{Request: long}, {Request: mount}}}
	snap.Decided = []Item{{Request: long, Decision: &Decision{Action: Deny, Scope: Once}, DecidedBy: "timeout\x1b]52;c;ZXZpbA==\x07"}}
	s := Screen{Width: 100, Height: 40}
	s.Update(snap)
	s.Message("\x1b]0;title\x07")
	view := s.View()
	for _, l := range view {
		if i, c := termsafe.Find(l); i >= 0 {
			t.Errorf("raw %s reaches the screen: %q", c, l)
		}
		if w := termsafe.Width(l); w > 100 {
			t.Errorf("line of %d columns on a terminal of 100: %q", w, l)
		}
	}
	text := strings.Join(view, "\n")
	if strings.Count(text, ".evil.test:443 ") != 3 {
		t.Errorf("the destination's end is cut, in the list, the selected request's lines or the decided:\n%s", text)
	}
	if !strings.Contains(text, `\x1b[2JAll clear`) {
		t.Errorf("the reason is not shown escaped:\n%s", text)
	}
	// Selected, the mount is shown whole: its source's end too.
	s.Key(KeyDown)
	if text := strings.Join(s.View(), ""); !strings.Contains(text, "data/etc/ssh at /mnt/") {
		t.Errorf("the selected mount's source is cut:\n%s", strings.Join(s.View(), "\n"))
	}
}
