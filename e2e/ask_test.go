package e2e

// network.unlisted: ask end to end: a real sandbox (the default agent image,
// its curl and getent), a real gateway, the test's own servers (.test names,
// see egress_test.go), and the real CLI deciding: requests --watch --json
// as the approver, allow and deny.

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
)

const askProfile = `image: propio-sandbox/agent:latest
network:
  mode: allowlist
  allow: [allowed.test]
  deny: [blocked.wild.test]
  unlisted: ask
  ask_timeout: 6s
`

// approver is `propio-sandbox requests --watch --json`, its events read as
// they come.
type approver struct {
	t      *testing.T
	events chan ask.Event
	cancel func()
}

func startApprover(t *testing.T, s *sandbox) *approver {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := s.Command(ctx, "requests", "--watch", "--json")
	out, _ := cmd.StdoutPipe()
	errOut, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &approver{t: t, events: make(chan ask.Event, 64), cancel: func() { cancel(); cmd.Wait() }}
	t.Cleanup(a.cancel)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev ask.Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				a.events <- ev
			}
		}
	}()
	// It says when the gateway counts it as an approver.
	attached := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(errOut)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "approving the requests of") {
				attached <- true
			}
		}
	}()
	select {
	case <-attached:
	case <-time.After(30 * time.Second):
		t.Fatal("requests --watch did not attach within 30s")
	}
	return a
}

// next is the next event of type typ (others are skipped).
func (a *approver) next(typ string) ask.Event {
	a.t.Helper()
	for {
		select {
		case ev := <-a.events:
			if ev.Type == typ {
				return ev
			}
		case <-time.After(30 * time.Second):
			a.t.Fatalf("no %s event within 30s", typ)
		}
	}
}

// nonePending fails if a request is pending among the events so far.
func (a *approver) nonePending() {
	a.t.Helper()
	for {
		select {
		case ev := <-a.events:
			if ev.Type == ask.EventPending {
				a.t.Fatalf("asked: %+v", ev.Request)
			}
		default:
			return
		}
	}
}

// inSandbox runs a shell command in the agent's container in the
// background; its output comes on the channel.
func inSandbox(r *running, script string) <-chan string {
	out := make(chan string, 1)
	go func() {
		b, _ := exec.Command("docker", "exec", r.Agent, "sh", "-c", script).CombinedOutput()
		out <- strings.TrimSpace(string(b))
	}()
	return out
}

func recv(t *testing.T, c <-chan string) string {
	t.Helper()
	select {
	case s := <-c:
		return s
	case <-time.After(60 * time.Second):
		t.Fatal("the command in the sandbox did not end within 60s")
		return ""
	}
}

// decide runs `propio-sandbox allow|deny ID --for scope`.
func decide(t *testing.T, s *sandbox, action, id, scope string) {
	t.Helper()
	if res := s.Run("", action, id, "--for", scope); res.Code != 0 {
		t.Fatalf("%s %s:\n%s", action, id, res)
	}
}

// curl fetches url once (no retry) and prints the status and body.
func curl(args string) string {
	return "curl -s --max-time 50 -w ' status=%{http_code} connect=%{http_connect}' " + args
}

func TestAskAllowlist(t *testing.T) {
	requireAgentImage(t)
	in := newInternet(t)
	s := newSandbox(t)
	rt := s.RuntimeDir()
	r := startAllowlist(t, s, in, askProfile)

	// The ask directory: the user's alone, and only the gateway has it.
	dirs, _ := filepath.Glob(filepath.Join(rt, "propio-sandbox", "ask", "*", ask.SocketName))
	if len(dirs) != 1 {
		t.Fatalf("ask sockets: %v", dirs)
	}
	askDir := filepath.Dir(dirs[0])
	if fi, err := os.Stat(askDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("ask directory %s: %v %v", askDir, fi.Mode(), err)
	}

	t.Run("no approver denies at once", func(t *testing.T) {
		start := time.Now()
		out := recv(t, inSandbox(r, curl("http://denied.test/")))
		if took := time.Since(start); !strings.Contains(out, "status=403") || took > 3*time.Second {
			t.Fatalf("without an approver: %q after %v; want a 403 at once", out, took)
		}
		t.Logf("denied without an approver in %v", time.Since(start))
	})

	a := startApprover(t, s)

	t.Run("allow once, proxy", func(t *testing.T) {
		got := inSandbox(r, curl("http://denied.test/"))
		ev := a.next(ask.EventPending)
		if ev.Request.Host != "denied.test" || ev.Request.Port != 80 || ev.Request.Via != "http" || ev.Request.Workspace != s.Workspace {
			t.Fatalf("request = %+v", ev.Request)
		}
		res := s.Run("", "requests", "--json")
		var reqs []ask.Request
		if json.Unmarshal([]byte(res.Stdout), &reqs) != nil || len(reqs) != 1 || reqs[0].ID != ev.Request.ID {
			t.Fatalf("requests --json:\n%s", res)
		}
		decide(t, s, "allow", ev.Request.ID, "once")
		if out := recv(t, got); !strings.Contains(out, "beta http denied.test /") || !strings.Contains(out, "status=200") {
			t.Fatalf("allowed once: %q", out)
		}
	})

	t.Run("deny", func(t *testing.T) {
		got := inSandbox(r, curl("https://wild.test/ --cacert /dev/null"))
		ev := a.next(ask.EventPending)
		if ev.Request.Host != "wild.test" || ev.Request.Port != 443 || ev.Request.Via != "connect" {
			t.Fatalf("request = %+v", ev.Request)
		}
		decide(t, s, "deny", ev.Request.ID, "once")
		if out := recv(t, got); !strings.Contains(out, "connect=403") {
			t.Fatalf("denied: %q", out)
		}
	})

	t.Run("deny rules never ask", func(t *testing.T) {
		if out := recv(t, inSandbox(r, curl("http://blocked.wild.test/"))); !strings.Contains(out, "status=403") {
			t.Fatalf("a deny rule: %q", out)
		}
		a.nonePending()
	})

	t.Run("merged", func(t *testing.T) {
		got := inSandbox(r, curl("http://sub.wild.test/a")+" & "+curl("http://sub.wild.test/b")+"; wait")
		ev := a.next(ask.EventPending)
		waitHeld(t, s, 2)
		decide(t, s, "allow", ev.Request.ID, "once")
		out := recv(t, got)
		if strings.Count(out, "status=200") != 2 {
			t.Fatalf("both: %q", out)
		}
		if d := a.next(ask.EventDecided); d.Request.ID != ev.Request.ID || d.DecidedBy != ask.ByUser {
			t.Fatalf("decided = %+v", d)
		}
		a.nonePending() // no second request for the same host and port
	})

	t.Run("transparent and DNS", func(t *testing.T) {
		// A lookup of a name no rule matches waits for the decision.
		got := inSandbox(r, curl("--noproxy '*' http://tcp.test/"))
		ev := a.next(ask.EventPending)
		if ev.Request.Host != "tcp.test" || ev.Request.Via != "dns" {
			t.Fatalf("request = %+v", ev.Request)
		}
		decide(t, s, "allow", ev.Request.ID, "once")
		if out := recv(t, got); !strings.Contains(out, "alpha http tcp.test /") {
			t.Fatalf("allowed by its lookup: %q", out)
		}
		// Allowed for the run: the kernel forwards the name (its answer is a
		// virtual address), and the next connection asks nothing.
		got = inSandbox(r, curl("--noproxy '*' http://sub.wild.test/one"))
		ev = a.next(ask.EventPending)
		if ev.Request.Host != "sub.wild.test" || ev.Request.Via != "dns" {
			t.Fatalf("request = %+v", ev.Request)
		}
		decide(t, s, "allow", ev.Request.ID, "run")
		if out := recv(t, got); !strings.Contains(out, "beta http sub.wild.test /one") {
			t.Fatalf("allowed for the run: %q", out)
		}
		if out := recv(t, inSandbox(r, curl("--noproxy '*' http://sub.wild.test/two"))); !strings.Contains(out, "beta http sub.wild.test /two") {
			t.Fatalf("allowed for the run, again: %q", out)
		}
		a.nonePending()
		// Through SOCKS5 (ALL_PROXY), held the same way.
		got = inSandbox(r, curl("-x socks5h://"+r.Gateway+":1080 http://denied.test/socks"))
		ev = a.next(ask.EventPending)
		if ev.Request.Host != "denied.test" || ev.Request.Via != "socks5" || ev.Request.Port != 80 {
			t.Fatalf("request = %+v", ev.Request)
		}
		decide(t, s, "allow", ev.Request.ID, "once")
		if out := recv(t, got); !strings.Contains(out, "beta http denied.test /socks") {
			t.Fatalf("allowed through SOCKS5: %q", out)
		}
		// Denied: the name does not exist.
		got = inSandbox(r, "getent hosts wild.test; echo exit=$?")
		ev = a.next(ask.EventPending)
		decide(t, s, "deny", ev.Request.ID, "run")
		if out := recv(t, got); !strings.Contains(out, "exit=2") {
			t.Fatalf("denied lookup: %q", out)
		}
	})

	t.Run("timeout and cap", func(t *testing.T) {
		var script []string
		for i := range ask.DefaultCap + 1 {
			script = append(script, curl("http://n"+string(rune('a'+i))+".test/"))
		}
		start := time.Now()
		got := inSandbox(r, strings.Join(script, " & ")+"; wait")
		for range ask.DefaultCap {
			a.next(ask.EventPending)
		}
		out := recv(t, got)
		if strings.Count(out, "status=403") != ask.DefaultCap+1 {
			t.Fatalf("over the cap and timed out: %q", out)
		}
		if took := time.Since(start); took < 5*time.Second {
			t.Fatalf("timed out after %v; want ask_timeout (6s)", took)
		}
	})

	t.Run("the agent cannot reach the ask socket", func(t *testing.T) {
		out := recv(t, inSandbox(r, "find / -xdev -name ask.sock 2>/dev/null; grep -c /ask /proc/self/mountinfo; "+
			curl("--noproxy '*' http://"+r.Gateway+":3128/v1/requests")+"; echo; "+
			curl("--noproxy '*' http://"+r.Gateway+":80/v1/requests")+"; echo; "+
			curl("-x http://"+r.Gateway+":3128 http://"+r.Gateway+"/v1/requests")))
		if strings.Contains(out, "ask.sock") || strings.Contains(out, `"id"`) || strings.Contains(out, "status=200") || !strings.HasPrefix(out, "0") {
			t.Fatalf("from inside:\n%s", out)
		}
	})

	t.Run("logs", func(t *testing.T) {
		entries := decisions(t, s, false)
		want := map[string]bool{"no-approver": false, "user": false, "timeout": false, "rule": false}
		for _, e := range entries {
			by, _ := e["decided_by"].(string)
			if _, ok := want[by]; ok && (by == "rule" || e["scope"] != nil) {
				want[by] = true
			}
		}
		for by, seen := range want {
			if !seen {
				t.Errorf("no decision by %s with its scope in logs --json", by)
			}
		}
		capped := false
		for _, e := range entries {
			if r, _ := e["reason"].(string); e["decided_by"] == "no-approver" && strings.Contains(r, "already wait") {
				capped = true
			}
		}
		if !capped {
			t.Error("no request denied over the cap in logs --json")
		}
		res := s.Run("", "logs")
		for _, w := range []string{"user/once", "user/run", "timeout/once", "no-approver/once"} {
			if !strings.Contains(res.Stdout, w) {
				t.Errorf("logs shows no %s:\n%s", w, res.Stdout)
			}
		}
	})

	// Last: an always decision also holds for the rest of this run, which
	// the subtests above must not see.
	t.Run("allow always", func(t *testing.T) {
		got := inSandbox(r, curl("http://denied.test/always"))
		ev := a.next(ask.EventPending)
		if ev.Request.Host != "denied.test" || ev.Request.Port != 80 {
			t.Fatalf("request = %+v", ev.Request)
		}
		decide(t, s, "allow", ev.Request.ID, "always")
		if out := recv(t, got); !strings.Contains(out, "beta http denied.test /always") || !strings.Contains(out, "status=200") {
			t.Fatalf("allowed always: %q", out)
		}
		res := s.Run("", "grants", "--json")
		var gs []map[string]any
		if res.Code != 0 || json.Unmarshal([]byte(res.Stdout), &gs) != nil || len(gs) != 1 ||
			gs[0]["host"] != "denied.test" || gs[0]["port"] != float64(80) || gs[0]["action"] != "allow" || gs[0]["by"] != "allow --for always" {
			t.Fatalf("grants --json after allow --for always:\n%s", res)
		}
	})

	r.Stop()
	if _, err := os.Stat(askDir); !os.IsNotExist(err) {
		t.Errorf("the ask directory outlived the sandbox: %v", err)
	}

	// The next run of the workspace decides it by the grant: no one asked.
	t.Run("the grant holds for the next run", func(t *testing.T) {
		r2 := startAllowlist(t, s, in, askProfile)
		defer r2.Stop()
		if out := recv(t, inSandbox(r2, curl("http://denied.test/again"))); !strings.Contains(out, "status=200") {
			t.Fatalf("the next run, under the grant: %q", out)
		}
		a.nonePending()
		var by string
		for _, e := range decisions(t, s, false) {
			if e["host"] == "denied.test" {
				by, _ = e["rule"].(string)
			}
		}
		if !strings.HasPrefix(by, "grant:") {
			t.Errorf("denied.test in the next run decided by %q, want the grant (grant:FILE:N)", by)
		}
	})
}

// waitHeld waits until the gateway holds n connections from the sandbox
// on its HTTP proxy port, as its network namespace's /proc/net/tcp says.
func waitHeld(t *testing.T, s *sandbox, n int) {
	t.Helper()
	gw := gatewayContainer(t, s)
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The sandbox's image (the test's, on every engine it runs on).
		out, _ := docker("run", "--rm", "--network", "container:"+gw, agentImage, "cat", "/proc/net/tcp")
		held := 0
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) > 3 && strings.HasSuffix(f[1], ":0C38") && f[3] == "01" {
				held++
			}
		}
		if held >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway holds %d connections, want %d", held, n)
		}
	}
}
