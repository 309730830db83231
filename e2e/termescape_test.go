package e2e

// Terminal escapes end to end: a real sandbox (the default agent image) asks
// with every control character a terminal acts on (C0, DEL, C1 as
// characters and as raw bytes, the bidi controls) in what it can choose: a
// mount's source, a reason, a target, the names it looks up, the names of
// the files it writes to a changeset, the path of the profile it runs with
// (a repository's). The real CLI shows them: requests (listed and
// --watch), approve in tmux, deny, ls, logs, changes and diff, and the
// --json of each. No raw control byte reaches their output: the approve pane keeps
// its title, no OSC 52 reaches tmux's clipboard, and a long destination
// keeps its end. The page of ui, in Chromium, shows them escaped too.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/termsafe"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// escPayload is what the attack of the issue printed: a cleared screen
// that says all is clear, a window title, the user's clipboard.
const escPayload = "\x1b[2JAll clear, nothing pending\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07"

// bidiControls are U+202A to U+202E and U+2066 to U+2069.
const bidiControls = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"

// c0 is every C0 control but NUL (which no path or JSON string of a shell
// holds), and DEL.
func c0() string {
	var b strings.Builder
	for c := byte(1); c < 0x20; c++ {
		b.WriteByte(c)
	}
	b.WriteByte(0x7f)
	return b.String()
}

// c1 is every C1 control as a character (UTF-8), or as raw bytes.
func c1(raw bool) string {
	var b strings.Builder
	for c := 0x80; c <= 0x9f; c++ {
		if raw {
			b.WriteByte(byte(c))
		} else {
			b.WriteRune(rune(c))
		}
	}
	return b.String()
}

// assertInert fails when out (what a command printed) holds a character a
// terminal acts on: anything termsafe escapes, on any line.
func assertInert(t *testing.T, what, out string) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if i, c := termsafe.Find(l); i >= 0 {
			t.Errorf("%s prints a raw %s: %q", what, c, l)
		}
	}
}

func TestTerminalEscapes(t *testing.T) {
	requireAgentImage(t)
	tmux := tmuxPath(t)
	in := newInternet(t)
	s := newSandbox(t)
	s.RuntimeDir()

	// The profiles are a repository's, in a directory whose name holds the
	// attack: ls and changes show their path.
	profDir := filepath.Join(s.Home, "repo-"+escPayload+c1(true)+bidiControls)
	writeFiles(t, profDir, map[string]string{
		"ask.yaml": "image: propio-sandbox/agent:latest\nagent_requests: [mount]\nnetwork:\n  mode: allowlist\n  allow: [allowed.test]\n  unlisted: ask\n  ask_timeout: 5m\n",
		"cs.yaml":  "image: propio-sandbox/agent:latest\nnetwork: {mode: none}\n",
	})
	// A host directory whose path holds every control the agent's JSON can
	// carry: the agent asks for it, and every frontend shows its path.
	source := filepath.Join(s.Home, "src-"+escPayload+c0()+c1(false)+bidiControls, "fixtures")
	writeFiles(t, source, map[string]string{"a.txt": "fixture"})
	// Requests the socket refuses: each control in a reason, in a target.
	var bodies []string
	for _, r := range termsafe.Controls() {
		c := string(r)
		for _, a := range []ask.AgentAsk{
			{Kind: ask.KindMount, Reason: "why" + c, Mount: &ask.MountAsk{Source: filepath.Dir(source), Target: "fixtures"}},
			{Kind: ask.KindMount, Reason: "fixtures", Mount: &ask.MountAsk{Source: filepath.Dir(source), Target: "/mnt/a" + c + "b"}},
		} {
			b, err := json.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			bodies = append(bodies, string(b))
		}
	}
	writeFiles(t, s.Workspace, map[string]string{"bodies.jsonl": strings.Join(bodies, "\n") + "\n", "dns.py": escDNSQuery})

	prof := filepath.Join(profDir, "ask.yaml")
	s.Env = append(s.Env, "PROPIO_SANDBOX_GATEWAY_NETWORK="+in.Network)
	r := startRunningArgs(t, s, "run", "-p", prof, "--", "sleep", "5m")

	// requests --watch, plain, is the approver while the requests come.
	watchOut, watchErr := &testenv.Buffer{}, &testenv.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	watch := s.Command(ctx, "requests", "--watch")
	watch.Stdout, watch.Stderr = watchOut, watchErr
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	stopWatch := func() { cancel(); watch.Wait() }
	t.Cleanup(stopWatch)
	waitOutput(t, "requests --watch attaching", watchErr, "approving the requests of")

	mountBody, _ := json.Marshal(ask.AgentAsk{Kind: ask.KindMount, Reason: "the fixtures", Mount: &ask.MountAsk{Source: source, Target: "fixtures"}})
	inSandbox(r, agentAsk(string(mountBody)))
	waitOutput(t, "the mount request in requests --watch", watchOut, "pending")
	long := "api.anthropic.com." + strings.Repeat("x", 60) + "." + strings.Repeat("x", 60) + ".evil.test"
	inSandbox(r, "curl -s --max-time 280 https://"+long+"/")
	waitOutput(t, "the long name in requests --watch", watchOut, ".evil.test:443")

	t.Run("requests", func(t *testing.T) {
		res := s.Run("", "requests")
		if res.Code != 0 {
			t.Fatalf("requests:\n%s", res)
		}
		assertInert(t, "requests", res.Stdout+res.Stderr)
		if !strings.Contains(res.Stdout, `\x1b[2JAll clear, nothing pending\x1b]0;pwned\a`) || !strings.Contains(res.Stdout, long+":443") {
			t.Errorf("requests does not show the source escaped and the name whole:\n%s", res.Stdout)
		}
		assertInert(t, "requests --watch", watchOut.String()+watchErr.String())
	})

	t.Run("approve in tmux", func(t *testing.T) {
		pane := tmuxApprove(t, s, tmux)
		pane.waitFor("Pending (2)")
		// Each request, selected in turn (k: the first, j: the second), is
		// shown whole below its row; no row loses the destination's end.
		var network, mount string
		for i, key := range []string{"k", "j"} {
			pane.tmux("send-keys", "-t", pane.target, key)
			text := pane.waitUntil(fmt.Sprintf("request %d selected", i+1), func(text string) bool {
				rows := strings.Split(text[strings.Index(text, "Pending (2)"):], "\n")
				return len(rows) > 3 && strings.HasPrefix(rows[1+i], "> ")
			})
			for _, l := range strings.Split(text, "\n") {
				if strings.Contains(l, "xxxxxxxxxx") && !strings.HasPrefix(l, "    ") && !strings.Contains(l, ".evil.test:443 ") {
					t.Errorf("a row cuts the destination's end at 100 columns: %q", l)
				}
			}
			if whole := selectedWhole(text); strings.Contains(whole, "evil.test") {
				network = whole
			} else {
				mount = whole
			}
		}
		if !strings.HasPrefix(network, long+":443 · ") {
			t.Errorf("the selected network request is not shown whole: %q", network)
		}
		if !strings.Contains(mount, "/src-"+`\x1b[2JAll clear, nothing pending\x1b]0;pwned\a\x1b]52;c;ZXZpbA==\a\x01\x02`) || !strings.Contains(mount, `\u2069/fixtures at fixtures · the fixtures`) {
			t.Errorf("the selected mount request is not shown whole and escaped: %q", mount)
		}
		if title := pane.tmux("display", "-p", "-t", pane.target, "#{pane_title}"); strings.TrimSpace(title) != "before" {
			t.Errorf("the pane's title is %q: an OSC 0 reached the terminal", title)
		}
		if bufs := pane.tmux("list-buffers"); strings.TrimSpace(bufs) != "" {
			t.Errorf("tmux's clipboard holds %q: an OSC 52 reached the terminal", bufs)
		}
		assertInert(t, "approve (the pane, with attributes)", strings.ReplaceAll(pane.capture(true), "\x1b[0m", ""))
		raw := pane.quit()
		for _, own := range []string{"\x1b[?1049h", "\x1b[?1049l", "\x1b[?25l", "\x1b[?25h", "\x1b[H", "\x1b[K", "\x1b[J", "\r\n"} {
			raw = strings.ReplaceAll(raw, own, "\n")
		}
		assertInert(t, "approve (its raw output, less its own sequences)", raw)
	})

	t.Run("ui in chromium", func(t *testing.T) {
		// The page puts data in as text; it shows the controls escaped too,
		// so that a bidi control cannot reorder a path there either.
		url := uiStart(t, s)
		c := startChromium(t, 1100, 760)
		if status := c.navigate(url); status != 200 {
			t.Fatalf("the page: %d", status)
		}
		c.awaitSelector(`li.request[data-id="a1"] .dest`, `\x1b[2JAll clear, nothing pending\x1b]0;pwned\a`, 30*time.Second)
		c.awaitSelector(`li.request[data-id="a1"] .dest`, `\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069/fixtures`, 30*time.Second)
	})

	t.Run("refused at the socket", func(t *testing.T) {
		out := recv(t, inSandbox(r, "while IFS= read -r b; do "+agentAsk(`'"$b"'`)+"; done < /workspace/bodies.jsonl"))
		lines := strings.Split(out, "\n")
		if len(lines) != len(bodies) {
			t.Fatalf("%d answers to %d requests:\n%s", len(lines), len(bodies), out)
		}
		for i, l := range lines {
			a := parseAnswer(t, l)
			if a.Decision != ask.Deny || a.DecidedBy != ask.ByRule || !strings.Contains(a.Error, " holds the control character ") {
				t.Errorf("%s: answer %+v, want refused", bodies[i], a)
			}
		}
		// The names the agent looks up: denied by the gateway, logged.
		if out := recv(t, inSandbox(r, "python3 /workspace/dns.py")); !strings.HasPrefix(out, "answered") {
			t.Fatalf("the DNS query: %s", out)
		}
	})

	t.Run("ls", func(t *testing.T) {
		res := s.Run("", "ls")
		if res.Code != 0 || !strings.Contains(res.Stdout, `repo-\x1b[2JAll clear`) {
			t.Fatalf("ls does not show the profile's path escaped:\n%s", res)
		}
		assertInert(t, "ls", res.Stdout+res.Stderr)
		res = s.Run("", "ls", "--json")
		if res.Code != 0 {
			t.Fatalf("ls --json:\n%s", res)
		}
		assertInert(t, "ls --json", res.Stdout+res.Stderr)
	})

	t.Run("decided", func(t *testing.T) {
		res := s.Run("", "requests", "--json")
		assertInert(t, "requests --json", res.Stdout+res.Stderr)
		var reqs []ask.Request
		if err := json.Unmarshal([]byte(res.Stdout), &reqs); err != nil || len(reqs) != 2 {
			t.Fatalf("requests --json: %v\n%s", err, res)
		}
		for _, req := range reqs {
			res := s.Run("", "deny", req.ID, "--for", "once")
			if res.Code != 0 {
				t.Fatalf("deny %s:\n%s", req.ID, res)
			}
			assertInert(t, "deny", res.Stdout+res.Stderr)
		}
		waitOutput(t, "the decisions in requests --watch", watchOut, "decided")
		assertInert(t, "requests --watch", watchOut.String()+watchErr.String())
	})

	t.Run("logs", func(t *testing.T) {
		// The mount request, the long name and the lookup, once logged (a
		// connection is, once it has ended).
		var res Result
		deadline := time.Now().Add(60 * time.Second)
		for {
			res = s.Run("", "logs")
			if strings.Contains(res.Stdout, `\x1b[2JAll clear`) && strings.Contains(res.Stdout, ".evil.test") && strings.Contains(res.Stdout, " dns ") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("logs does not show the mount request, the long name and the lookup:\n%s", res)
			}
			time.Sleep(200 * time.Millisecond)
		}
		assertInert(t, "logs", res.Stdout+res.Stderr)
		res = s.Run("", "logs", "--json")
		assertInert(t, "logs --json", res.Stdout+res.Stderr)
	})

	stopWatch()
	r.Stop()

	t.Run("changes", func(t *testing.T) {
		// Files whose names hold every control a name can: C0 and DEL,
		// C1, the bidi controls. (Not the C1 bytes raw: a changeset keeps
		// its paths as JSON strings, which cannot hold a name that is not
		// UTF-8; DNS names and the profile's path carry them raw above.)
		dir := pyEscape(escPayload + c1(false) + bidiControls)
		script := `import os; os.chdir("/workspace"); open(bytes(range(1, 0x20)) + b"\x7f", "w").write("a\n"); os.makedirs("` + dir + `/d"); open("` + dir + `/d/f", "w").write("b\n"); ` +
			`open("content.txt", "wb").write(b"` + pyEscape(escPayload+c0()) + `\n" + bytes(range(0x80, 0xa0)) + "` + pyEscape(c1(false)+bidiControls) + `\n".encode())`
		run := s.Run("", "run", "--changeset", "-p", filepath.Join(profDir, "cs.yaml"), "--", "python3", "-c", script)
		if run.Code != 0 {
			t.Fatalf("the changeset's run:\n%s", run)
		}
		assertInert(t, "run --changeset", run.Stdout+run.Stderr)
		for _, args := range [][]string{{"changes"}, {"changes", "--json"}, {"diff", "--stat"}, {"diff", "--json"}} {
			res := s.Run("", args...)
			if res.Code != 0 {
				t.Fatalf("%s:\n%s", strings.Join(args, " "), res)
			}
			assertInert(t, strings.Join(args, " "), res.Stdout+res.Stderr)
		}
		// The diff itself, on a terminal: the files' content too (to a
		// pipe it is byte for byte, for git apply). Tabs are kept as they
		// are: they lay out the content (and end a ---/+++ name that holds
		// a space, as git does).
		term := terminalStart(t, s, "diff")
		if err := term.wait(60 * time.Second); err != nil {
			t.Fatalf("diff on a terminal: %v\n%s", err, term.output())
		}
		select {
		case <-term.eof:
		case <-time.After(10 * time.Second):
		}
		out := term.output()
		if !strings.Contains(out, `+\x1b[2JAll clear, nothing pending\x1b]0;pwned\a\x1b]52;c;ZXZpbA==\a\x01`) {
			t.Errorf("diff on a terminal does not show the content escaped:\n%s", out)
		}
		assertInert(t, "diff on a terminal", strings.ReplaceAll(strings.ReplaceAll(out, "\r\n", "\n"), "\t", " "))
		if res := s.Run("", "discard"); res.Code != 0 {
			t.Errorf("discard:\n%s", res)
		}
	})
}

// pyEscape writes s as the inside of a Python string literal of ASCII (a
// bytes literal when s is ASCII).
func pyEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteString(`\` + string(r))
		case r < 0x20 || r >= 0x7f && r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r >= 0x100:
			fmt.Fprintf(&b, `\U%08x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// escDNSQuery sends the sandbox's resolver a query for a name whose labels
// hold every control byte (NUL to US and DEL, the C1 bytes raw, the bidi
// controls in UTF-8), and says whether it was answered.
const escDNSQuery = `import socket, struct
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
labels = [bytes(range(0, 0x20)) + b"\x7f", bytes(range(0x80, 0xa0)), "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069".encode(), b"test"]
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l for l in labels) + b"\x00" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(20)
s.sendto(q, (ns, 53))
print("answered", len(s.recv(512)))
`

// waitOutput waits until buf holds want.
func waitOutput(t *testing.T, what string, buf *testenv.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(buf.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %q within 60s:\n%s", what, want, buf.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tmuxPath is tmux, which approve's test runs in.
func tmuxPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("tmux")
	if err != nil {
		dockerfileSkipOrFail(t, "no tmux (Debian: apt-get install tmux)")
	}
	return p
}

// tmuxPane is approve running in a pane of a tmux server of the test's own,
// 100 columns wide, its raw output piped to a file.
type tmuxPane struct {
	t            *testing.T
	bin, sock    string
	target, pipe string
}

func (p *tmuxPane) tmux(args ...string) string {
	p.t.Helper()
	out, err := exec.Command(p.bin, append([]string{"-S", p.sock}, args...)...).CombinedOutput()
	if err != nil {
		p.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// tmuxApprove starts approve in a new tmux server: the pane first waits
// for a line, while its title is set ("before"), the clipboard is turned
// on (an OSC 52 would make a buffer) and its output is piped to a file;
// then approve replaces the waiting shell in the same pane.
func tmuxApprove(t *testing.T, s *sandbox, bin string) *tmuxPane {
	t.Helper()
	dir := t.TempDir()
	p := &tmuxPane{t: t, bin: bin, sock: filepath.Join(dir, "sock"), target: "approve:0.0", pipe: filepath.Join(dir, "raw")}
	start := exec.Command(bin, "-S", p.sock, "-f", "/dev/null", "new-session", "-d", "-s", "approve", "-x", "100", "-y", "50",
		"sh -c 'read line; exec \"$0\" approve' "+launcher)
	start.Dir, start.Env = s.Workspace, append(append([]string(nil), s.Env...), "TERM=xterm-256color")
	if out, err := start.CombinedOutput(); err != nil {
		t.Fatalf("starting tmux: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command(bin, "-S", p.sock, "kill-server").Run() })
	p.tmux("set-option", "-g", "set-clipboard", "on")
	p.tmux("set-option", "-g", "allow-rename", "on")
	p.tmux("select-pane", "-t", p.target, "-T", "before")
	p.tmux("pipe-pane", "-t", p.target, "-o", "cat >> "+p.pipe)
	p.tmux("send-keys", "-t", p.target, "Enter")
	return p
}

// capture is the pane's text (with attributes as escapes: -e).
func (p *tmuxPane) capture(attrs bool) string {
	args := []string{"capture-pane", "-p", "-t", p.target}
	if attrs {
		args = append(args, "-e")
	}
	return p.tmux(args...)
}

// waitFor waits until the pane shows want, and returns the pane.
func (p *tmuxPane) waitFor(want string) string {
	p.t.Helper()
	return p.waitUntil(fmt.Sprintf("%q", want), func(text string) bool { return strings.Contains(text, want) })
}

// waitUntil waits until the pane's text is as ok says, and returns it.
func (p *tmuxPane) waitUntil(what string, ok func(string) bool) string {
	p.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		text := p.capture(false)
		if ok(text) {
			return text
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("the approve pane never showed %s:\n%s", what, text)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// selectedWhole is the selected request as approve shows it whole: the
// lines below its row, indented by four, joined.
func selectedWhole(text string) string {
	lines := strings.Split(text, "\n")
	var whole strings.Builder
	for i, l := range lines {
		if !strings.HasPrefix(l, "> ") {
			continue
		}
		for _, w := range lines[i+1:] {
			if !strings.HasPrefix(w, "    ") {
				break
			}
			whole.WriteString(strings.TrimPrefix(w, "    "))
		}
	}
	return whole.String()
}

// quit ends approve with q and returns everything it wrote to the pane.
func (p *tmuxPane) quit() string {
	p.t.Helper()
	p.tmux("send-keys", "-t", p.target, "q")
	deadline := time.Now().Add(30 * time.Second)
	for {
		raw, _ := os.ReadFile(p.pipe)
		if strings.Contains(string(raw), "\x1b[?1049l") {
			return string(raw)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("approve did not give the screen back after q:\n%q", raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
