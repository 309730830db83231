package e2e

// A hostile agent's mount and port requests, end to end: from inside a
// real sandbox (network none, agent_requests) the agent plants a link in
// the workspace to a host directory it must not read, asks for paths that
// are not plain (.., //), for the kernel's files (/proc/self/environ: the
// launcher's environment), swaps a link in after its request was shown,
// and asks for privileged and engine ports. The real CLI is the approver
// (requests --watch, requests, allow, logs); the host observes what was
// shown and that the agent never reads the host's secret.

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/ask"
)

func TestAgentRequestsHostile(t *testing.T) {
	requireAgentImage(t)
	s := newSandbox(t)
	s.RuntimeDir()
	// hostEtc stands for the host's /etc: a directory outside the workspace
	// whose file the agent must never read.
	hostEtc := filepath.Join(s.Home, "host-etc")
	secret := "host-only-" + randomID()
	writeFiles(t, hostEtc, map[string]string{"shadow": secret})
	data := filepath.Join(s.Home, "data")
	writeFiles(t, data, map[string]string{"a.txt": "read from the host"})
	shared := filepath.Join(s.Home, "shared") // mounted rw by the user's profile
	writeFiles(t, shared, map[string]string{".keep": ""})
	r := startRunning(t, s, "image: propio-sandbox/agent:latest\nagent_requests: [port, mount]\nnetwork: {mode: none}\n"+
		"mounts: [{source: ~/shared, target: /shared, mode: rw}]\n")
	ap := startApprover(t, s)
	ws := s.Workspace // what the agent reads in /proc/self/mountinfo

	// neverRead fails if the secret is anywhere the agent can read of what
	// the launcher copies.
	neverRead := func(t *testing.T) {
		t.Helper()
		if out := recv(t, inSandbox(r, "grep -rl '"+secret+"' /run/propio-sandbox 2>/dev/null; echo done")); out != "done" {
			t.Errorf("the host's secret is readable inside: %q", out)
		}
	}
	// refusedAtOnce asks for body and wants it refused by rule, asking no
	// one, with an error saying want.
	refusedAtOnce := func(t *testing.T, body, want string) {
		t.Helper()
		a := parseAnswer(t, recv(t, inSandbox(r, agentAsk(body))))
		if a.Decision != ask.Deny || a.DecidedBy != ask.ByRule || !strings.Contains(a.Error, want) {
			t.Errorf("answer %+v; want denied by rule, saying %q", a, want)
		}
		ap.nonePending()
	}

	t.Run("a link planted in the workspace is refused, naming where it leads", func(t *testing.T) {
		if out := recv(t, inSandbox(r, "ln -s "+hostEtc+" /workspace/test-fixtures && echo ok")); out != "ok" {
			t.Fatalf("planting the link: %q", out)
		}
		refusedAtOnce(t, `{"kind":"mount","mount":{"source":"`+ws+`/test-fixtures"},"reason":"the fixtures"}`,
			ws+"/test-fixtures goes through a symbolic link, to "+hostEtc)
		refusedAtOnce(t, `{"kind":"mount","mount":{"source":"`+ws+`/test-fixtures/shadow"},"reason":"the fixtures"}`,
			"to "+hostEtc+"/shadow")
		neverRead(t)
	})

	t.Run("a path with .. or // is refused", func(t *testing.T) {
		long := ws + "/test-fixtures/small/" + strings.Repeat("data/../", 40) + "../../../" + filepath.Base(s.Home) + "/host-etc"
		refusedAtOnce(t, `{"kind":"mount","mount":{"source":"`+long+`"},"reason":"the fixtures"}`, "is not a plain path (.. in it)")
		refusedAtOnce(t, `{"kind":"mount","mount":{"source":"`+s.Home+`//host-etc"},"reason":"x"}`, "is not a plain path (// in it)")
		neverRead(t)
	})

	t.Run("the kernel's files are refused", func(t *testing.T) {
		for _, src := range []string{"/proc/self/environ", "/proc", "/sys/kernel", "/dev"} {
			refusedAtOnce(t, `{"kind":"mount","mount":{"source":"`+src+`"},"reason":"x"}`, "the kernel's view of the host: never copied")
		}
		if out := recv(t, inSandbox(r, "ls /run/propio-sandbox/mounts")); out != "" {
			t.Errorf("copies inside: %q", out)
		}
	})

	t.Run("what is asked is shown resolved, beside what the agent wrote", func(t *testing.T) {
		got := inSandbox(r, agentAsk(`{"kind":"mount","mount":{"source":"~/data","target":"data"},"reason":"the fixtures"}`))
		req := ap.next(ask.EventPending).Request
		shown := "~/data → " + data + " at data"
		if req.Mount == nil || req.Mount.Resolved != data || req.What() != shown {
			t.Fatalf("request %+v (%q); want it resolved to %s", req.Mount, req.What(), data)
		}
		if out := cli(t, s, "requests").Stdout; !strings.Contains(out, shown) {
			t.Errorf("requests does not show %q:\n%s", shown, out)
		}
		decide(t, s, "allow", req.ID, "once")
		a := parseAnswer(t, recv(t, got))
		if a.Decision != ask.Allow || a.Error != "" || a.Result["path"] != "/run/propio-sandbox/mounts/data" {
			t.Fatalf("answer %+v", a)
		}
		if out := recv(t, inSandbox(r, "cat /run/propio-sandbox/mounts/data/a.txt")); out != "read from the host" {
			t.Errorf("reading the copy inside: %q", out)
		}
		logged := false
		for _, line := range strings.Split(cli(t, s, "logs", "--json").Stdout, "\n") {
			var e struct{ Kind, Asked string }
			if json.Unmarshal([]byte(line), &e) == nil && e.Kind == "mount" && e.Asked == shown {
				logged = true
			}
		}
		if !logged {
			t.Errorf("logs --json has no mount entry asking %q", shown)
		}
	})

	t.Run("a link swapped in after the request was shown is not followed", func(t *testing.T) {
		if out := recv(t, inSandbox(r, "mkdir /shared/swap && echo harmless > /shared/swap/x && echo ok")); out != "ok" {
			t.Fatalf("making /shared/swap: %q", out)
		}
		got := inSandbox(r, agentAsk(`{"kind":"mount","mount":{"source":"`+shared+`/swap"},"reason":"x"}`))
		req := ap.next(ask.EventPending).Request
		if req.Mount == nil || req.Mount.Resolved != shared+"/swap" {
			t.Fatalf("request %+v", req.Mount)
		}
		if out := recv(t, inSandbox(r, "rm -r /shared/swap && ln -s "+hostEtc+" /shared/swap && echo ok")); out != "ok" {
			t.Fatalf("swapping in the link: %q", out)
		}
		decide(t, s, "allow", req.ID, "once")
		a := parseAnswer(t, recv(t, got))
		if a.Error == "" || !strings.Contains(a.Error, "symbolic link, to "+hostEtc) || a.Result != nil {
			t.Errorf("answer %+v; want nothing copied, saying the link leads to %s", a, hostEtc)
		}
		neverRead(t)
	})

	t.Run("privileged and engine ports are refused", func(t *testing.T) {
		refusedAtOnce(t, `{"kind":"port","port":80,"reason":"preview"}`, "port 80 is privileged on the host")
		refusedAtOnce(t, `{"kind":"port","port":2375,"reason":"preview"}`, "port 2375 is a container engine's API port")
	})
}
