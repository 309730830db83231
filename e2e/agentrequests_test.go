package e2e

// agent_requests end to end: the agent asks from inside a real sandbox (the
// default agent image's curl on /run/propio-sandbox/request.sock), in
// network none, open and allowlist; the real CLI decides (requests --watch
// as the approver, allow, deny), the engine raises the limits live and the
// cgroup inside shows it; logs shows the decisions; the agent finds no
// approval socket.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// startRunning runs `run -p PROFILE -- sleep 5m` in the background and
// returns once the agent's container runs (startAllowlist, for an
// allowlist, also finds the gateway).
func startRunning(t *testing.T, s *sandbox, profileYAML string) *running {
	t.Helper()
	return startRunningArgs(t, s, "run", "-p", s.Profile(profileYAML), "--", "sleep", "5m")
}

// startRunningArgs starts the launcher with args (a run that lasts) in the
// background and returns once the agent's container runs.
func startRunningArgs(t *testing.T, s *sandbox, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	r := &running{s: s, cmd: s.Command(ctx, args...), done: make(chan Result, 1)}
	go func() {
		res, err := execute(ctx, r.cmd)
		if err != nil {
			res.Stderr += "\n" + err.Error()
			res.Code = -1
		}
		r.done <- res
	}()
	t.Cleanup(func() { r.Stop() })
	label := "label=dev.propio-sandbox.workspace=" + s.Workspace
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, _ := docker("ps", "-q", "--filter", label, "--filter", "label=com.docker.compose.service=agent", "--filter", "status=running")
		if id := strings.TrimSpace(out); id != "" {
			r.Agent = id
			return r
		}
		select {
		case res := <-r.done:
			t.Fatalf("the sandbox ended before it ran:\n%s", res)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox did not start in 2 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RuntimeDir gives the test's launchers an $XDG_RUNTIME_DIR of their own,
// as a desktop session has one, short enough for the sockets made in it;
// it is removed when the test ends. It returns the directory.
func (s *sandbox) RuntimeDir() string {
	s.t.Helper()
	rt, err := os.MkdirTemp("", "rt-e2e")
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { os.RemoveAll(rt) })
	s.Env = append(s.Env, "XDG_RUNTIME_DIR="+rt)
	return rt
}

// agentAsk is the curl an agent runs to ask: it prints the answer.
func agentAsk(body string) string {
	return "curl -s --max-time 50 --unix-socket /run/propio-sandbox/request.sock -X POST http://sandbox/v1/requests -d '" + body + "'"
}

// cgroupMemory and cgroupPids print the container's limits as its cgroup
// (v2, else v1) has them.
const (
	cgroupMemory = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
	cgroupPids   = "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max"
	// cgroupCPUs prints the CPU quota per 100ms period, in microseconds.
	cgroupCPUs = "cut -d' ' -f1 /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us"
)

func parseAnswer(t *testing.T, out string) ask.Answer {
	t.Helper()
	var a ask.Answer
	if err := json.Unmarshal([]byte(out), &a); err != nil {
		t.Fatalf("the agent's answer %q: %v", out, err)
	}
	return a
}

func TestAgentRequestsResources(t *testing.T) {
	requireAgentImage(t)
	for _, mode := range []string{"none", "open", "allowlist"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "allowlist" && testenv.EnginePodman(t) {
				t.Skip("network.mode allowlist does not run on Podman yet (run refuses it, saying why)")
			}
			agentRequestsResources(t, mode)
		})
	}
}

func agentRequestsResources(t *testing.T, mode string) {
	s := newSandbox(t)
	rt := s.RuntimeDir()
	prof := "image: propio-sandbox/agent:latest\nagent_requests: [resources]\nresources: {cpus: 1, memory: 1g, pids: 100}\nnetwork:\n  mode: " + mode + "\n"
	var r *running
	if mode == "allowlist" {
		r = startAllowlist(t, s, newInternet(t), prof+"  allow: [allowed.test]\n")
	} else {
		r = startRunning(t, s, prof)
	}

	t.Run("the agent reaches no approval socket", func(t *testing.T) {
		out := recv(t, inSandbox(r, "ls -A /run/propio-sandbox; find / -xdev \\( -name ask.sock -o -name launcher.sock \\) 2>/dev/null; "+
			"curl -s -o /dev/null -w '%{http_code}' --unix-socket /run/propio-sandbox/request.sock http://sandbox/v1/requests; echo; "+
			"touch /run/propio-sandbox/x 2>&1 | grep -c 'Read-only'"))
		if out != "request.sock\n404\n1" {
			t.Fatalf("inside: %q, want request.sock alone (no ask.sock, no launcher.sock), no approval endpoint, read-only", out)
		}
		// On the host, launcher.sock is beside the sandbox.json of the ask
		// directory, mode 0700, which is not the agent's.
		socks, _ := filepath.Glob(filepath.Join(rt, "propio-sandbox", "ask", "*", ask.LauncherSocketName))
		if len(socks) != 1 {
			t.Fatalf("launcher sockets: %v", socks)
		}
	})

	t.Run("no approver denies at once", func(t *testing.T) {
		start := time.Now()
		a := parseAnswer(t, recv(t, inSandbox(r, agentAsk(`{"kind":"resources","resources":{"memory":2147483648},"reason":"a big build"}`))))
		if a.Decision != ask.Deny || a.DecidedBy != ask.ByNoApprover || time.Since(start) > 5*time.Second {
			t.Fatalf("without an approver: %+v after %v", a, time.Since(start))
		}
	})

	ap := startApprover(t, s)

	t.Run("allow raises the limits", func(t *testing.T) {
		got := inSandbox(r, agentAsk(`{"kind":"resources","resources":{"memory":2147483648,"pids":300},"reason":"a big build"}`))
		ev := ap.next(ask.EventPending)
		req := ev.Request
		if req.Kind != ask.KindResources || req.Resources == nil || req.Resources.Memory != 2<<30 || req.Resources.PIDs != 300 || req.Reason != "a big build" || req.Via != "agent" {
			t.Fatalf("request = %+v", req)
		}
		res := s.Run("", "requests")
		if !strings.Contains(res.Stdout, "resources") || !strings.Contains(res.Stdout, "memory 2GiB, pids 300") || !strings.Contains(res.Stdout, "a big build") {
			t.Fatalf("requests:\n%s", res)
		}
		decide(t, s, "allow", req.ID, "once")
		a := parseAnswer(t, recv(t, got))
		if a.Decision != ask.Allow || a.DecidedBy != ask.ByUser || a.Error != "" || a.Result["memory"] != float64(2<<30) || a.Result["pids"] != float64(300) {
			t.Fatalf("answer %+v", a)
		}
		if mem := recv(t, inSandbox(r, cgroupMemory)); mem != strconv.Itoa(2<<30) {
			t.Errorf("memory limit inside: %q, want %d", mem, 2<<30)
		}
		if pids := recv(t, inSandbox(r, cgroupPids)); pids != "300" {
			t.Errorf("pids limit inside: %q, want 300", pids)
		}
		if runtime.NumCPU() < 2 {
			return
		}
		got = inSandbox(r, agentAsk(`{"kind":"resources","resources":{"cpus":2},"reason":"parallel tests"}`))
		decide(t, s, "allow", ap.next(ask.EventPending).Request.ID, "once")
		if a := parseAnswer(t, recv(t, got)); a.Decision != ask.Allow || a.Result["cpus"] != float64(2) {
			t.Fatalf("answer %+v", a)
		}
		if quota := recv(t, inSandbox(r, cgroupCPUs)); quota != "200000" {
			t.Errorf("CPU quota inside: %q, want 200000 (2 cores)", quota)
		}
	})

	t.Run("deny", func(t *testing.T) {
		got := inSandbox(r, agentAsk(`{"kind":"resources","resources":{"pids":500},"reason":"more workers"}`))
		ev := ap.next(ask.EventPending)
		decide(t, s, "deny", ev.Request.ID, "once")
		if a := parseAnswer(t, recv(t, got)); a.Decision != ask.Deny || a.DecidedBy != ask.ByUser {
			t.Fatalf("answer %+v", a)
		}
		if pids := recv(t, inSandbox(r, cgroupPids)); pids != "300" {
			t.Errorf("pids limit inside after a deny: %q, want 300", pids)
		}
	})

	t.Run("above the bounds is refused without asking", func(t *testing.T) {
		a := parseAnswer(t, recv(t, inSandbox(r, agentAsk(`{"kind":"resources","resources":{"pids":5000},"reason":"x"}`))))
		if a.Decision != ask.Deny || a.DecidedBy != ask.ByRule || !strings.Contains(a.Error, "above the maximum of 1000") {
			t.Fatalf("answer %+v", a)
		}
		ap.nonePending()
	})

	t.Run("logs shows the decisions", func(t *testing.T) {
		res := s.Run("", "logs")
		for _, want := range []string{
			`denied +no-approver/once +agent +resources memory 2GiB +`,
			`allowed +user/once +agent +resources memory 2GiB, pids 300 +`,
			`denied +user/once +agent +resources pids 500 +`,
			`denied +rule +agent +resources pids 5000 +`,
		} {
			if !regexp.MustCompile(want).MatchString(res.Stdout) {
				t.Errorf("logs has no line matching %q:\n%s", want, res)
			}
		}
	})

	r.Stop()
	for _, d := range []string{"ask", "agent"} {
		if left, _ := filepath.Glob(filepath.Join(rt, "propio-sandbox", d, "*")); len(left) != 0 {
			t.Errorf("left after the sandbox: %v", left)
		}
	}
}

// TestAgentRequestsPortAndMount: the agent asks, through its socket, for a
// port and for a host directory, with network none; once allowed, the
// host reaches the sandbox's server through the published port, and the
// agent reads the directory's copy. A guarded path (~/.ssh) is refused
// without asking.
func TestAgentRequestsPortAndMount(t *testing.T) {
	requireAgentImage(t)
	s := newSandbox(t)
	s.RuntimeDir()
	if err := os.WriteFile(filepath.Join(s.Workspace, "hello.txt"), []byte("served from the sandbox"), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(s.Home, "data")
	writeFiles(t, data, map[string]string{"a.txt": "read from the host"})
	writeFiles(t, filepath.Join(s.Home, ".ssh"), map[string]string{"id_ed25519": "PRIVATE KEY"})
	r := startRunning(t, s, "image: propio-sandbox/agent:latest\nagent_requests: [port, mount]\nnetwork: {mode: none}\n")
	if out, err := docker("exec", "-d", r.Agent, "python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/workspace"); err != nil {
		t.Fatalf("starting a server inside: %v %s", err, out)
	}
	ap := startApprover(t, s)

	t.Run("port", func(t *testing.T) {
		got := inSandbox(r, agentAsk(`{"kind":"port","port":8000,"reason":"preview the app"}`))
		req := ap.next(ask.EventPending).Request
		if req.Kind != ask.KindPort || req.Port != 8000 || req.Reason != "preview the app" {
			t.Fatalf("request = %+v", req)
		}
		decide(t, s, "allow", req.ID, "once")
		a := parseAnswer(t, recv(t, got))
		url, _ := a.Result["url"].(string)
		if a.Decision != ask.Allow || a.Error != "" || !strings.HasPrefix(url, "http://127.0.0.1:") {
			t.Fatalf("answer %+v", a)
		}
		// The server may still be starting: a few tries, a second apart.
		var body string
		for i := 0; i < 20 && body != "served from the sandbox"; i++ {
			if i > 0 {
				time.Sleep(500 * time.Millisecond)
			}
			body, _ = portGet(url + "/hello.txt")
		}
		if body != "served from the sandbox" {
			t.Fatalf("GET %s/hello.txt from the host: %q", url, body)
		}
	})

	t.Run("mount", func(t *testing.T) {
		got := inSandbox(r, agentAsk(`{"kind":"mount","mount":{"source":"`+data+`"},"reason":"the fixtures"}`))
		req := ap.next(ask.EventPending).Request
		if req.Kind != ask.KindMount || req.Mount == nil || req.Mount.Source != data {
			t.Fatalf("request = %+v", req)
		}
		decide(t, s, "allow", req.ID, "once")
		a := parseAnswer(t, recv(t, got))
		path, _ := a.Result["path"].(string)
		if a.Decision != ask.Allow || a.Error != "" || path != "/run/propio-sandbox/mounts/data" {
			t.Fatalf("answer %+v", a)
		}
		if out := recv(t, inSandbox(r, "cat "+path+"/a.txt")); out != "read from the host" {
			t.Errorf("reading the copy inside: %q", out)
		}
	})

	t.Run("a guarded path is refused without asking", func(t *testing.T) {
		a := parseAnswer(t, recv(t, inSandbox(r, agentAsk(`{"kind":"mount","mount":{"source":"~/.ssh"},"reason":"keys"}`))))
		if a.Decision != ask.Deny || a.DecidedBy != ask.ByRule || a.Error == "" {
			t.Fatalf("answer %+v", a)
		}
		ap.nonePending()
		if out := recv(t, inSandbox(r, "grep -r 'PRIVATE KEY' /run/propio-sandbox 2>/dev/null; echo done")); out != "done" {
			t.Errorf("the key is readable inside: %q", out)
		}
	})
}
