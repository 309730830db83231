package approver

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/propio/propio-sandbox/internal/termsafe"
)

// keys are the terminal UI's decision keys.
var keys = []struct {
	key   string
	d     Decision
	label string
}{
	{"a", Decision{Action: Allow, Scope: Once}, "allow once"},
	{"r", Decision{Action: Allow, Scope: Run}, "allow for the run"},
	{"A", Decision{Action: Allow, Scope: Always}, "allow always"},
	{"d", Decision{Action: Deny, Scope: Once}, "deny once"},
	{"x", Decision{Action: Deny, Scope: Run}, "deny for the run"},
	{"D", Decision{Action: Deny, Scope: Always}, "deny always"},
}

// Key names of the keys that are not a character.
const (
	KeyUp   = "up"
	KeyDown = "down"
	KeyQuit = "quit"
)

// Screen is the terminal UI's model: the board as last seen, the selected
// request and the last message. It draws text and turns keys into
// decisions; Terminal does the input and output.
//
// A decision key applies to the request selected when it is read, by its
// id. When the selected request goes without the user's decision (its
// timeout, or another approver, decided it), the selection moves to the
// next one; a decision key read within Settle of that move decides
// nothing, as it was meant for the request that went.
type Screen struct {
	Width, Height int
	// Now is the clock of the selection's moves; nil: time.Now.
	Now     func() time.Time
	snap    Snapshot
	sel     string    // key of the selected pending request
	decided string    // key of the request the user decided last
	moved   time.Time // when the selected request went, not decided by the user
	msg     string
}

// Settle is how long after the selected request went that a decision key
// decides nothing.
const Settle = time.Second

// Update takes the board's snapshot, keeping the selection on the same
// request when it is still pending.
func (s *Screen) Update(snap Snapshot) {
	s.snap = snap
	if s.index() >= 0 {
		return
	}
	if s.sel != "" && s.sel != s.decided {
		s.moved = s.now()
	}
	s.sel = ""
	if len(snap.Pending) > 0 {
		s.sel = itemKey(snap.Pending[0])
	}
}

// Decided records that the user decided it: the selection moves on from
// it by the user's doing.
func (s *Screen) Decided(it Item) { s.decided = itemKey(it) }

func (s *Screen) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func itemKey(it Item) string { return key(it.Request.Project, it.Request.ID) }

// index is the selected request's place among the pending ones, or -1.
func (s *Screen) index() int {
	for i, it := range s.snap.Pending {
		if itemKey(it) == s.sel {
			return i
		}
	}
	return -1
}

// Message sets the line shown under the lists.
func (s *Screen) Message(msg string) { s.msg = msg }

// Key applies one key; it returns the decision to make for the selected
// request, if the key is one, and whether to quit.
func (s *Screen) Key(k string) (it *Item, d *Decision, quit bool) {
	i := s.index()
	switch k {
	case KeyQuit, "q":
		return nil, nil, true
	case KeyUp, "k":
		if i > 0 {
			s.sel, s.moved = itemKey(s.snap.Pending[i-1]), time.Time{}
		}
		return nil, nil, false
	case KeyDown, "j":
		if i >= 0 && i+1 < len(s.snap.Pending) {
			s.sel, s.moved = itemKey(s.snap.Pending[i+1]), time.Time{}
		}
		return nil, nil, false
	}
	for _, kd := range keys {
		if kd.key != k {
			continue
		}
		if i < 0 {
			s.msg = "nothing is pending"
			return nil, nil, false
		}
		if !s.moved.IsZero() && s.now().Sub(s.moved) < Settle {
			s.msg = "not decided: the request you had selected is gone, and " + s.snap.Pending[i].Request.What() + " is selected now; press again to decide it"
			return nil, nil, false
		}
		if kd.d.Scope == Always && !s.snap.Always {
			s.msg = "always cannot be saved here yet: choose once or for the run"
			return nil, nil, false
		}
		it, d := s.snap.Pending[i], kd.d
		return &it, &d, false
	}
	return nil, nil, false
}

// Dest is host:port as a user writes it.
func Dest(host string, port int) string {
	if port == 0 {
		return host
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// View draws the screen, one string a line, each at most Width wide.
func (s *Screen) View() []string {
	var lines []string
	add := func(format string, a ...any) { lines = append(lines, fmt.Sprintf(format, a...)) }
	var names []string
	for _, sb := range s.snap.Sandboxes {
		names = append(names, sb.Project)
	}
	if len(names) == 0 {
		add("propio-sandbox approve: no sandbox that can ask is running here yet; waiting for one")
	} else {
		add("propio-sandbox approve: approving for %s", inert(strings.Join(names, ", ")))
	}
	if s.snap.Error != "" {
		add("error: %s", inert(s.snap.Error))
	}
	add("")
	add("Pending (%d)", len(s.snap.Pending))
	for _, it := range s.snap.Pending {
		r, mark := it.Request, "  "
		if itemKey(it) == s.sel {
			mark = "> "
		}
		what, why := inert(r.What()), inert(r.Reason)
		row := fmt.Sprintf("%s%s %-7s %-18s %s", mark, s.what(r, 2, 1+7+1+18+1+24), inert(r.Via), inert(r.Project), why)
		lines = append(lines, row)
		if mark == "> " && s.Width > 0 && (termsafe.Width(row) > s.Width || !strings.Contains(row, what)) {
			// The request a key decides is shown whole, wrapped, when
			// its row is cut.
			for _, l := range termsafe.Wrap(what+" · "+why, s.Width-4) {
				add("    %s", l)
			}
		}
	}
	add("")
	var legend []string
	for _, kd := range keys {
		if kd.d.Scope != Always || s.snap.Always {
			legend = append(legend, kd.key+" "+kd.label)
		}
	}
	add("%s · ↑↓ select · q quit", strings.Join(legend, " · "))
	if s.msg != "" {
		add("%s", inert(s.msg))
	}
	add("")
	add("Decided")
	for _, it := range s.snap.Decided {
		r, d := it.Request, Decision{}
		if it.Decision != nil {
			d = *it.Decision
		}
		add("  %s  %-5s %-6s %-11s %s %-7s %s", it.Decided.Local().Format("15:04:05"), d.Action, d.Scope, inert(it.DecidedBy),
			s.what(r, 2+8+2+5+1+6+1+11+1, 1+7+1+18), inert(r.Via), inert(r.Project))
	}
	if s.Height > 0 && len(lines) > s.Height {
		lines = lines[:s.Height]
	}
	for i, l := range lines {
		lines[i] = clip(l, s.Width)
	}
	return lines
}

// what is what r asks for, inert, in a column of at least 28 columns that
// takes what the line has to spare: before columns are left of it, after
// are kept for what follows. When it is wider, its beginning is cut, never
// its end: a name's domain, a path's last elements.
func (s *Screen) what(r Request, before, after int) string {
	w := inert(r.What())
	if s.Width > 0 {
		w = termsafe.Left(w, max(min(28, s.Width-before), s.Width-before-after))
	}
	return termsafe.Pad(w, 28)
}

// inert is s as a terminal shows it without acting on it.
func inert(s string) string { return termsafe.Inert(s) }

// clip cuts l to width columns (0: no limit), marking the cut.
func clip(l string, width int) string {
	if width <= 0 {
		return l
	}
	return termsafe.Right(l, width)
}

// Terminal runs the terminal UI on a terminal in raw mode (in, out) until
// ctx ends or the user quits; size reports the terminal's width and height,
// and a value on resized (which may be nil) draws the screen again.
func Terminal(ctx context.Context, b *Board, in io.Reader, out io.Writer, size func() (int, int), resized <-chan os.Signal) error {
	keysIn, stop := make(chan string), make(chan struct{})
	defer close(stop)
	go readKeys(in, keysIn, stop)
	io.WriteString(out, "\x1b[?1049h\x1b[?25l") // the alternate screen, no cursor
	defer io.WriteString(out, "\x1b[?25h\x1b[?1049l")
	var s Screen
	for {
		snap, changed := b.Snapshot()
		s.Update(snap)
		s.Width, s.Height = size()
		draw(out, s.View())
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-resized:
		case k, ok := <-keysIn:
			if !ok {
				return nil
			}
			it, d, quit := s.Key(k)
			if quit {
				return nil
			}
			if d != nil {
				msg, ok := decide(ctx, b, it, *d)
				if ok {
					s.Decided(*it)
				}
				s.Message(msg)
			}
		}
	}
}

// decide makes the decision and says how it went.
func decide(ctx context.Context, b *Board, it *Item, d Decision) (msg string, ok bool) {
	r := it.Request
	if err := b.Decide(ctx, r.Project, r.ID, d); err != nil {
		return "error: " + err.Error(), false
	}
	return fmt.Sprintf("%s %s: %s", d.Action, r.What(), d.Scope), true
}

// draw writes lines from the top left, clearing what is left of the old.
func draw(out io.Writer, lines []string) {
	var sb strings.Builder
	sb.WriteString("\x1b[H")
	for _, l := range lines {
		sb.WriteString(l)
		sb.WriteString("\x1b[K\r\n")
	}
	sb.WriteString("\x1b[J")
	io.WriteString(out, sb.String())
}

// readKeys sends the keys read from in: characters, arrows, and KeyQuit for
// Ctrl-C, Ctrl-D or the end of input.
func readKeys(in io.Reader, keys chan<- string, stop <-chan struct{}) {
	defer close(keys)
	buf := make([]byte, 64)
	for {
		n, err := in.Read(buf)
		for _, k := range parseKeys(buf[:n]) {
			select {
			case keys <- k:
			case <-stop:
				return
			}
			if k == KeyQuit {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// parseKeys splits what a read returned into keys.
func parseKeys(b []byte) []string {
	var out []string
	for len(b) > 0 {
		switch {
		case len(b) >= 3 && b[0] == 0x1b && (b[1] == '[' || b[1] == 'O') && (b[2] == 'A' || b[2] == 'B'):
			out = append(out, map[byte]string{'A': KeyUp, 'B': KeyDown}[b[2]])
			b = b[3:]
			continue
		case b[0] == 3 || b[0] == 4:
			out = append(out, KeyQuit)
		case b[0] >= 0x20 && b[0] < 0x7f:
			out = append(out, string(b[0]))
		}
		b = b[1:]
	}
	return out
}
