//go:build linux

package e2e

// The approval path under a hostile agent (issue 28): a flood of slow
// connections to request.sock from inside a real sandbox neither exhausts
// the launcher's descriptors nor prints into the user's terminal; an
// approver attached to a workspace serves every sandbox of it from its
// first instant (plain runs, NAME-2, a persistent one); and a decision
// applies only to the request it was shown for (approve's model over a
// real sandbox, the page of ui in Chromium).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	approve "github.com/propio/propio-sandbox/internal/approver"
	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"golang.org/x/sys/unix"
)

// privateRuntime gives s a runtime directory of its own, where its ask,
// agent and approver directories go.
func privateRuntime(t *testing.T, s *sandbox) string {
	t.Helper()
	rt, err := os.MkdirTemp("", "approval-e2e") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rt) })
	s.Env = append(s.Env, "XDG_RUNTIME_DIR="+rt)
	return rt
}

// openFiles counts the descriptors process pid holds.
func openFiles(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// floodScript opens n connections to request.sock from inside, each with
// half a header, holds them for a while, and prints how many it opened.
const floodScript = `python3 - <<'EOF'
import resource, socket, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for i in range(%d):
    s = socket.socket(socket.AF_UNIX)
    s.setblocking(False)
    try:
        s.connect("/run/propio-sandbox/request.sock")
        s.send(b"POST /v1/requests HTTP/1.1\r\nHost: sandbox\r\n")
    except OSError:
        s.close()
        continue
    held.append(s)
print("held", len(held), flush=True)
time.sleep(8)
EOF`

// TestAgentSocketFlood: from inside, more slow connections to request.sock
// than the launcher could hold (its descriptors lowered to make it so):
// the launcher holds a bounded number, prints no accept error into the
// user's terminal, and serves the agent's request after the flood.
func TestAgentSocketFlood(t *testing.T) {
	requireAgentImage(t)
	s := newSandbox(t)
	privateRuntime(t, s)
	r := startRunning(t, s, "image: propio-sandbox/agent:latest\nagent_requests: [resources]\nresources: {cpus: 1, memory: 1g, pids: 100}\nnetwork:\n  mode: none\n")
	pid := r.cmd.Process.Pid
	base := openFiles(t, pid)
	// The launcher may open base+256 descriptors: a flood of 1500 would
	// exhaust them, were each accepted.
	limit := uint64(base + 256)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Fatalf("lowering the launcher's descriptors: %v", err)
	}
	flood := inSandbox(r, fmt.Sprintf(floodScript, 1500))
	peak := base
	for done := false; !done; {
		select {
		case out := <-flood:
			if !strings.Contains(out, "held ") {
				t.Fatalf("the flood: %q", out)
			}
			n, _ := strconv.Atoi(strings.Fields(out[strings.Index(out, "held "):])[1])
			t.Logf("the flood held %d connections; the launcher %d descriptors at most (%d before)", n, peak, base)
			if n <= 64 {
				t.Fatalf("the flood held %d connections: not more than the cap", n)
			}
			done = true
		case <-time.After(20 * time.Millisecond):
			peak = max(peak, openFiles(t, pid))
		}
	}
	if peak > base+64+32 {
		t.Errorf("the launcher held %d descriptors during the flood, %d before: not bounded by the cap", peak, base)
	}
	a := parseAnswer(t, recv(t, inSandbox(r, agentAsk(`{"kind":"resources","resources":{"pids":200},"reason":"after the flood"}`))))
	if a.Decision != ask.Deny || a.DecidedBy != ask.ByNoApprover {
		t.Fatalf("the agent's request after the flood: %+v, want deny by no-approver (served)", a)
	}
	res := r.Stop()
	for _, bad := range []string{"ccept", "too many open files", "http: "} {
		if strings.Contains(res.Stderr, bad) {
			t.Errorf("the launcher printed %q into the user's terminal:\n%s", bad, res.Stderr)
		}
	}
}

// firstInstantProfile asks both ways: the gateway for an unlisted host, the
// launcher for the agent's request.
const firstInstantProfile = `image: propio-sandbox/agent:latest
agent_requests: [resources]
resources: {cpus: 1, memory: 1g, pids: 100}
network:
  mode: allowlist
  allow: [allowed.test]
  unlisted: ask
  ask_timeout: 60s
`

// askAtOnce is what each sandbox runs as it starts: both requests at once.
const askAtOnce = `curl -s -o /dev/null -w 'network=%{http_code}\n' --max-time 50 http://first.test/ &
curl -s --max-time 50 --unix-socket /run/propio-sandbox/request.sock -X POST http://sandbox/v1/requests -d '{"kind":"resources","resources":{"pids":200},"reason":"at once"}'
echo
wait`

// TestApproverFromFirstInstant: with `requests --watch --json` attached to
// the workspace before any sandbox starts, sandboxes that ask in their
// first instant, one run after another, two at once (NAME and NAME-2) and
// a persistent one (up, then exec), have every request shown and decided
// by the user: none is denied for want of an approver.
func TestApproverFromFirstInstant(t *testing.T) {
	requireAgentImage(t)
	s := newSandbox(t)
	rt := privateRuntime(t, s)
	prof := s.Profile(firstInstantProfile)
	// The approver looks for sandboxes once, as it starts: what it serves
	// after, it serves by the launchers' announcements alone.
	s.Env = append(s.Env, "PROPIO_SANDBOX_E2E_RESCAN=1h")
	a := startApprover(t, s)

	// The approver's side: each pending request is denied once, by the
	// user, as it comes; every decision is kept.
	var mu sync.Mutex
	var pending, decided []ask.Event
	go func() {
		for ev := range a.events {
			mu.Lock()
			if ev.Type == ask.EventPending {
				pending = append(pending, ev)
			} else {
				decided = append(decided, ev)
			}
			mu.Unlock()
			if ev.Type == ask.EventPending {
				sb := ask.Sandbox{Project: ev.Request.Project, Dir: filepath.Join(rt, "propio-sandbox", "ask", ev.Request.Project)}
				go sb.Decide(context.Background(), ev.Request.ID, ask.Decision{Action: ask.Deny, Scope: ask.ScopeOnce})
			}
		}
	}()
	check := func(what string, res Result) {
		t.Helper()
		if res.Code != 0 || !strings.Contains(res.Stdout, "network=403") || !strings.Contains(res.Stdout, `"decided_by":"user"`) {
			t.Errorf("%s: want the network request and the agent's both denied by the user:\n%s", what, res)
		}
	}
	run := func() Result {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		res, err := execute(ctx, s.Command(ctx, "run", "-p", prof, "--", "sh", "-c", askAtOnce))
		if err != nil {
			res.Stderr += "\n" + err.Error()
		}
		return res
	}
	for i := range 2 {
		check(fmt.Sprintf("run %d", i+1), run())
	}
	// Two at once: the second is NAME-2.
	var both [2]Result
	var wg sync.WaitGroup
	for i := range both {
		wg.Add(1)
		go func() { defer wg.Done(); both[i] = run() }()
	}
	wg.Wait()
	check("the first of two at once", both[0])
	check("the second of two at once", both[1])
	// A persistent sandbox, asking as soon as exec runs.
	p := up(t, s, prof)
	check("exec in a persistent sandbox", p.exec("", "sh", "-c", askAtOnce))

	mu.Lock()
	defer mu.Unlock()
	projects := map[string]bool{}
	for _, ev := range pending {
		projects[ev.Request.Project] = true
	}
	if len(pending) != 10 || len(projects) < 3 {
		t.Errorf("the approver was shown %d requests of %d sandboxes, want 10 of 5 (NAME-2 among them): %v", len(pending), len(projects), projects)
	}
	for _, ev := range decided {
		if ev.DecidedBy != ask.ByUser {
			t.Errorf("%s %s of %s decided by %s, want the user", ev.Request.ID, ev.Request.What(), ev.Request.Project, ev.DecidedBy)
		}
	}
	// The decision logs agree: ten decisions by the user, none for want of
	// an approver.
	logs, _ := filepath.Glob(filepath.Join(s.Home, ".local", "state", "propio-sandbox", "logs", "*"))
	byUser := 0
	for _, path := range logs {
		entries, err := decisionlog.Read(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			switch e.DecidedBy {
			case ask.ByUser:
				byUser++
			case ask.ByNoApprover:
				t.Errorf("%s: %+v", filepath.Base(path), e)
			}
		}
	}
	if byUser != 10 {
		t.Errorf("%d decisions by the user in %d logs, want 10", byUser, len(logs))
	}
}

// TestApproveInFlightKey: approve's model (a Board and its Screen, with a
// clock of the test's) over a real sandbox, attached before it starts. The
// request shown selected times out in the sandbox; the key pressed as the
// selection moves to the next decides nothing; that next request is left
// to its own timeout.
func TestApproveInFlightKey(t *testing.T) {
	requireAgentImage(t)
	s := newSandbox(t)
	rt := privateRuntime(t, s)
	t.Setenv("XDG_RUNTIME_DIR", rt) // the board's, in this process
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	board := approve.NewBoard(func() ([]approve.Target, error) {
		sbs, err := ask.Find("", true)
		return approve.Targets(sbs), err
	}, nil, 200*time.Millisecond)
	reg, err := ask.Register("", true)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer reg.Close()
	defer cancel()
	wg.Add(2)
	go func() { defer wg.Done(); board.Run(ctx) }()
	go func() {
		defer wg.Done()
		reg.Serve(ctx, func(ctx context.Context, sb ask.Sandbox) { board.Serve(ctx, approve.Targets([]ask.Sandbox{sb})[0]) })
	}()

	r := startRunning(t, s, "image: propio-sandbox/agent:latest\nnetwork:\n  mode: allowlist\n  allow: [allowed.test]\n  unlisted: ask\n  ask_timeout: 5s\n")
	await := func(what string, ok func(approve.Snapshot) bool) approve.Snapshot {
		t.Helper()
		deadline := time.After(time.Minute)
		for {
			snap, changed := board.Snapshot()
			if ok(snap) {
				return snap
			}
			select {
			case <-changed:
			case <-deadline:
				t.Fatalf("the board never showed %s: %+v", what, snap)
			}
		}
	}
	pendingIs := func(dests ...string) func(approve.Snapshot) bool {
		return func(snap approve.Snapshot) bool {
			if len(snap.Pending) != len(dests) {
				return false
			}
			for i, it := range snap.Pending {
				if it.Request.What() != dests[i] {
					return false
				}
			}
			return true
		}
	}
	one := inSandbox(r, curl("http://one.test/"))
	await("one.test pending", pendingIs("one.test:80"))
	time.Sleep(2 * time.Second) // two.test times out that much after one.test
	two := inSandbox(r, curl("http://two.test/"))
	now := time.Now()
	scr := approve.Screen{Width: 200, Now: func() time.Time { return now }}
	scr.Update(await("both pending", pendingIs("one.test:80", "two.test:80")))
	if view := strings.Join(scr.View(), "\n"); !strings.Contains(view, "> one.test:80") {
		t.Fatalf("one.test is not selected:\n%s", view)
	}
	// one.test times out as the user presses a key for it.
	scr.Update(await("one.test gone, two.test pending", pendingIs("two.test:80")))
	if it, d, _ := scr.Key("a"); it != nil || d != nil {
		t.Fatalf("the key in flight decided %s", it.Request.What())
	}
	if view := strings.Join(scr.View(), "\n"); !strings.Contains(view, "not decided") || !strings.Contains(view, "> two.test:80") {
		t.Fatalf("the screen after the key in flight:\n%s", view)
	}
	now = now.Add(approve.Settle) // a key the user presses once they have seen it
	if it, _, _ := scr.Key("a"); it == nil || it.Request.What() != "two.test:80" {
		t.Fatalf("a key after the move: %+v, want two.test", it)
	}
	if out := recv(t, one); !strings.Contains(out, "status=403") {
		t.Errorf("one.test: %q, want denied (its timeout)", out)
	}
	if out := recv(t, two); !strings.Contains(out, "status=403") {
		t.Errorf("two.test: %q, want denied (its timeout)", out)
	}
	snap := await("both decided", func(s approve.Snapshot) bool { return len(s.Decided) == 2 })
	for _, it := range snap.Decided {
		if it.DecidedBy != ask.ByTimeout {
			t.Errorf("%s decided by %s, want its timeout", it.Request.What(), it.DecidedBy)
		}
	}
}

// TestUIInFlightClick: on the page of ui, in Chromium, the pointer rests on
// a request's "Allow for this run" when that request times out: its entry
// stays where it was, its buttons disabled, and the click that follows
// decides nothing; the next request is decided by its own button, by its
// id; once the pointer leaves the list, the entry that went is removed.
func TestUIInFlightClick(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	s, runtimeDir := approverSandbox(t)
	f := startFakeAsk(t, runtimeDir, "propio-workspace-0a1b2c3d", s.Workspace)
	f.ask("r1", "api.example.test", 443, "connect")
	f.ask("r2", "registry.example.test", 443, "http")
	url := uiStart(t, s)
	f.awaitAttached(t, 30*time.Second)
	c := startChromium(t, 1100, 760)
	if status := c.navigate(url); status != 200 {
		t.Fatalf("the page: %d", status)
	}
	c.awaitSelector(`li.request[data-id="r2"]`, "registry.example.test:443", 30*time.Second)

	x, y := c.pointAt(`li.request[data-id="r1"] button[data-action="allow"][data-scope="run"]`)
	c.mouse("mouseMoved", x, y)
	f.expire("r1") // its timeout, as the user clicks
	c.awaitSelector(`li.request.gone[data-id="r1"]`, "no longer pending", 30*time.Second)
	c.mouse("mousePressed", x, y)
	c.mouse("mouseReleased", x, y)
	// The next decision the sandbox receives is the one made with r2's own
	// button: the click in flight made none.
	c.click(`li.request[data-id="r2"] button[data-action="deny"][data-scope="once"]`)
	if d := f.awaitDecision(t, 30*time.Second); d.ID != "r2" || d.Decision != (askDecision{"deny", "once"}) {
		t.Fatalf("decision %+v, want r2 deny once (the click in flight decided %s)", d, d.ID)
	}
	c.mouse("mouseMoved", 1, 1)
	var gone bool
	c.eval(`new Promise((resolve) => {
		const check = () => { if (!document.querySelector('li.request[data-id="r1"]')) { resolve(true); return true; } return false; };
		if (check()) return;
		const obs = new MutationObserver(() => { if (check()) obs.disconnect(); });
		obs.observe(document, { subtree: true, childList: true });
		setTimeout(() => { obs.disconnect(); resolve(false); }, 30000);
	})`, &gone)
	if !gone {
		t.Fatal("the entry of r1 stayed after the pointer left the list")
	}
}
